"""POST /v1/chat/completions: messages rendered with the chat template, one engine request with
n choices, answered whole or as server-sent events."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, AsyncIterator, Dict, List, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from pagedllm.outputs import RequestOutput
from pagedllm.server.chat_images import chat_images, expanded_len
from pagedllm.chat_template import ChatTemplateError, open_final_message
from pagedllm.streaming import ChoiceTracker, holdback_for
from pagedllm.server.errors import OpenAIError, bad_request
from pagedllm.server.cache_salt import request_cache_key
from pagedllm.server.generation import (ClientDisconnected, Prompt, abort_all, beam_params,
                                        check_beam_search,
                                        collect, merge, sampling_params, submit, truncate)
from pagedllm.server.ignored_fields import ignored_fields_header
from pagedllm.server.logprobs import chat_logprobs, prompt_logprobs
from pagedllm.server.protocol import ChatCompletionRequest, ChatMessage
from pagedllm.server.responses import (ChatChoice, ChatCompletionChunk, ChatCompletionResponse,
                                       ChatResponseMessage, ChatStreamChoice, DeltaMessage,
                                       UsageInfo)
from pagedllm.server.sse import DONE_EVENT, sse_event, sse_response
from pagedllm.server.state import ServerState, new_id, off_loop_if_large


def render_chat(state: ServerState, messages: List[ChatMessage],
                add_generation_prompt: bool = True, continue_final_message: bool = False,
                add_special_tokens: Optional[bool] = None,
                chat_template_kwargs: Optional[Dict[str, Any]] = None) -> Prompt:
    """The prompt of a conversation: rendered with the chat template, then tokenized.

    Args:
        state: the server.
        messages: the conversation.
        add_generation_prompt: end with the assistant's header.
        continue_final_message: end with the last message left open, so the model continues
            it (vLLM's; the template's end-of-turn after it is cut off).
        add_special_tokens: add bos when tokenizing (None: unless the template wrote it).
        chat_template_kwargs: more template variables. An ``add_generation_prompt`` or
            ``continue_final_message`` here wins over the field of the same name, as in vLLM
            (it must then be a boolean); ``messages``, ``bos_token`` and ``eos_token`` cannot
            be replaced.
    Returns:
        The prompt (text and token ids).
    """
    kwargs = dict(chat_template_kwargs or {})
    for name in ("add_generation_prompt", "continue_final_message"):
        if name in kwargs and not isinstance(kwargs[name], bool):
            raise bad_request(f"chat_template_kwargs.{name} must be true or false, got "
                              f"{kwargs[name]!r}", "chat_template_kwargs")
    add_generation_prompt = kwargs.pop("add_generation_prompt", add_generation_prompt)
    continue_final_message = kwargs.pop("continue_final_message", continue_final_message)
    if state.tokenizer is None:
        raise bad_request(f"the model {state.model_name!r} has no tokenizer.json, so chat is "
                          "not available (use /v1/completions with token ids)", "messages")
    if add_generation_prompt and continue_final_message:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be "
                          "true (set add_generation_prompt to false)", "continue_final_message")
    images, image_text = chat_images(state, messages)
    dicts = []
    for i, m in enumerate(messages):
        d = {"role": m.role, "content": m.text(i, image_text)}
        if m.name is not None:
            d["name"] = m.name
        dicts.append(d)
    try:
        text = state.chat_template.render(dicts, add_generation_prompt, kwargs)
    except ChatTemplateError as e:
        raise bad_request(str(e), "messages") from None
    if continue_final_message:
        try:
            text = open_final_message(text, dicts[-1]["content"], len(dicts) - 1)
        except ChatTemplateError as e:
            raise bad_request(str(e), "continue_final_message") from None
    add_special = (not state.chat_template.starts_with_bos(text) if add_special_tokens is None
                   else add_special_tokens)
    return Prompt(text, state.encode(text, add_special_tokens=add_special), tuple(images))


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, raw: Request,
                                 arrival_time: float) -> Response:
    """Handles one /v1/chat/completions request.

    Args:
        state: the server.
        req: the parsed body.
        raw: the HTTP request (disconnect detection, bearer token for cache salting).
        arrival_time: when it arrived (time.monotonic()).
    Returns:
        A JSON response, or a text/event-stream one when streaming.
    """
    headers = ignored_fields_header(req, state.settings.strict_fields, "/v1/chat/completions")
    state.check_model(req.model)
    stops = req.stop_list()
    check_beam_search(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    if req.stream and req.prompt_logprobs is not None:
        raise bad_request("prompt_logprobs is not available when streaming", "prompt_logprobs")
    chars = sum(len(str(m.content or "")) for m in req.messages)
    prompt = await off_loop_if_large(chars, render_chat, state, req.messages,
                                     req.add_generation_prompt, req.continue_final_message,
                                     req.add_special_tokens, req.chat_template_kwargs)
    kept = truncate(prompt.token_ids, req.truncate_prompt_tokens, state.max_model_len)
    if len(kept) != len(prompt.token_ids):
        prompt = Prompt(None, kept, prompt.images)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    prompt_len = expanded_len(state, prompt)  # image placeholders expanded
    max_tokens = state.max_tokens(requested, prompt_len, param)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    state.check_limits(1, req.n, max_tokens, logprobs, prompt_len, req.prompt_logprobs)
    params = sampling_params(state, req, max_tokens, stops, logprobs,
                             prompt_logprobs=req.prompt_logprobs)
    request_id = new_id("chatcmpl")
    key = request_cache_key(raw, req.cache_salt, state.settings.cache_salt_by_api_key)
    streams = await submit(state, request_id, [prompt], params, arrival_time, key,
                           beam_params(req, params), prompt_field="messages")
    if req.stream:
        events = _stream(state, req, request_id, prompt, streams, holdback_for(stops))
        return sse_response(events, headers)
    try:
        (final,) = await collect(state, raw, streams)
    except ClientDisconnected:
        return Response(status_code=499)
    body = _response(state, req, request_id, prompt, final)
    return JSONResponse(body.model_dump(), headers=headers)


def _response(state: ServerState, req: ChatCompletionRequest, request_id: str, prompt: Prompt,
              final: RequestOutput) -> ChatCompletionResponse:
    choices = []
    for comp in final.outputs:
        logprobs = None
        if req.logprobs and comp.logprobs is not None:
            logprobs = chat_logprobs(comp.token_ids, comp.logprobs, req.top_logprobs or 0,
                                     req.return_tokens_as_token_ids)
        choices.append(ChatChoice(index=comp.index, message=ChatResponseMessage(content=comp.text),
                                  logprobs=logprobs, finish_reason=comp.finish_reason,
                                  stop_reason=comp.stop_reason))
    # the engine's prompt: image placeholders expanded to their patch positions
    usage = UsageInfo.of(len(final.prompt_token_ids or prompt.token_ids),
                         sum(len(c.token_ids) for c in final.outputs))
    plp = None
    if req.prompt_logprobs is not None:
        plp = prompt_logprobs(final.prompt_token_ids or prompt.token_ids, final.prompt_logprobs,
                              req.prompt_logprobs)
    return ChatCompletionResponse(id=request_id, model=state.model_name, choices=choices,
                                  usage=usage, prompt_logprobs=plp)


async def _stream(state: ServerState, req: ChatCompletionRequest, request_id: str,
                  prompt: Prompt, streams, holdback: int) -> AsyncIterator[str]:
    created = int(time.time())
    trackers: Dict[int, ChoiceTracker] = defaultdict(lambda: ChoiceTracker(holdback))
    tokens: Dict[int, int] = {}

    def chunk(choice: Optional[ChatStreamChoice], usage: Optional[UsageInfo] = None) -> str:
        if usage is None and choice is not None and req.continuous_usage():
            usage = UsageInfo.of(expanded_len(state, prompt), sum(tokens.values()))
        return sse_event(ChatCompletionChunk(id=request_id, created=created,
                                             model=state.model_name,
                                             choices=[choice] if choice else [], usage=usage))

    try:
        for j in range(req.n):  # OpenAI opens every choice with the role
            yield chunk(ChatStreamChoice(index=j, delta=DeltaMessage(role="assistant", content="")))
        async for _, out in merge(streams):
            for comp in out.outputs:
                tracker = trackers[comp.index]
                tokens[comp.index] = len(comp.token_ids)
                d = tracker.advance(comp)
                if d is None:
                    continue
                logprobs = None
                if req.logprobs and d.logprobs is not None:
                    logprobs = chat_logprobs(d.token_ids, d.logprobs, req.top_logprobs or 0,
                                             req.return_tokens_as_token_ids)
                delta = DeltaMessage(content=d.text) if d.text else DeltaMessage()
                yield chunk(ChatStreamChoice(index=comp.index, delta=delta, logprobs=logprobs,
                                             finish_reason=d.finish_reason,
                                             stop_reason=d.stop_reason))
        if req.include_usage():
            yield chunk(None, UsageInfo.of(expanded_len(state, prompt), sum(tokens.values())))
        yield DONE_EVENT
    except OpenAIError as e:  # the engine stopped mid-stream
        yield sse_event(e.response().body.decode("utf-8"))
        yield DONE_EVENT
    finally:
        abort_all(state, streams)  # a client that left mid-stream: free its blocks now
