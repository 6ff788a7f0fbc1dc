"""POST /v1/chat/completions: messages rendered with the chat template, one engine request with
n choices, answered whole or as server-sent events."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import AsyncIterator, Dict, List, Optional

from fastapi import Request
from fastapi.responses import Response

from pagedllm.outputs import RequestOutput
from pagedllm.server.chat_template import ChatTemplateError
from pagedllm.server.logprobs import chat_logprobs
from pagedllm.streaming import ChoiceTracker, holdback_for
from pagedllm.server.errors import OpenAIError, bad_request
from pagedllm.server.generation import (ClientDisconnected, Prompt, abort_all, collect, merge,
                                        sampling_params, submit)
from pagedllm.server.protocol import ChatCompletionRequest, ChatMessage, check_extra_fields
from pagedllm.server.responses import (ChatChoice, ChatCompletionChunk, ChatCompletionResponse,
                                       ChatResponseMessage, ChatStreamChoice, DeltaMessage,
                                       UsageInfo)
from pagedllm.server.sse import DONE_EVENT, sse_event, sse_response
from pagedllm.server.state import ServerState, new_id


def render_chat(state: ServerState, messages: List[ChatMessage],
                add_generation_prompt: bool = True) -> Prompt:
    """The prompt of a conversation: rendered with the chat template, then tokenized (the
    tokenizer adds bos unless the template already wrote it)."""
    if state.tokenizer is None:
        raise bad_request(f"the model {state.model_name!r} has no tokenizer.json, so chat is "
                          "not available (use /v1/completions with token ids)", "messages")
    dicts = []
    for i, m in enumerate(messages):
        d = {"role": m.role, "content": m.text(i)}
        if m.name is not None:
            d["name"] = m.name
        dicts.append(d)
    try:
        text = state.chat_template.render(dicts, add_generation_prompt)
    except ChatTemplateError as e:
        raise bad_request(str(e), "messages") from None
    add_special = not state.chat_template.starts_with_bos(text)
    return Prompt(text, state.encode(text, add_special_tokens=add_special))


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, raw: Request,
                                 arrival_time: float) -> Response:
    """Handles one /v1/chat/completions request."""
    check_extra_fields(req)
    state.check_model(req.model)
    stops = req.stop_list()
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    prompt = render_chat(state, req.messages, req.add_generation_prompt)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = state.max_tokens(requested, len(prompt.token_ids), param)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(state, req, max_tokens, stops, logprobs)
    request_id = new_id("chatcmpl")
    streams = await submit(state, request_id, [prompt], params, arrival_time)
    if req.stream:
        return sse_response(_stream(state, req, request_id, prompt, streams, holdback_for(stops)))
    try:
        (final,) = await collect(state, raw, streams)
    except ClientDisconnected:
        return Response(status_code=499)
    return _response(state, req, request_id, prompt, final)


def _response(state: ServerState, req: ChatCompletionRequest, request_id: str, prompt: Prompt,
              final: RequestOutput) -> ChatCompletionResponse:
    choices = []
    for comp in final.outputs:
        logprobs = None
        if req.logprobs and comp.logprobs is not None:
            logprobs = chat_logprobs(comp.token_ids, comp.logprobs, req.top_logprobs or 0)
        choices.append(ChatChoice(index=comp.index, message=ChatResponseMessage(content=comp.text),
                                  logprobs=logprobs, finish_reason=comp.finish_reason,
                                  stop_reason=comp.stop_reason))
    usage = UsageInfo.of(len(prompt.token_ids), sum(len(c.token_ids) for c in final.outputs))
    return ChatCompletionResponse(id=request_id, model=state.model_name, choices=choices,
                                  usage=usage)


async def _stream(state: ServerState, req: ChatCompletionRequest, request_id: str,
                  prompt: Prompt, streams, holdback: int) -> AsyncIterator[str]:
    created = int(time.time())
    trackers: Dict[int, ChoiceTracker] = defaultdict(lambda: ChoiceTracker(holdback))
    tokens: Dict[int, int] = {}

    def chunk(choice: Optional[ChatStreamChoice], usage: Optional[UsageInfo] = None) -> str:
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
                    logprobs = chat_logprobs(d.token_ids, d.logprobs, req.top_logprobs or 0)
                delta = DeltaMessage(content=d.text) if d.text else DeltaMessage()
                yield chunk(ChatStreamChoice(index=comp.index, delta=delta, logprobs=logprobs,
                                             finish_reason=d.finish_reason,
                                             stop_reason=d.stop_reason))
        if req.include_usage():
            yield chunk(None, UsageInfo.of(len(prompt.token_ids), sum(tokens.values())))
        yield DONE_EVENT
    except OpenAIError as e:  # the engine stopped mid-stream
        yield sse_event(e.response().body.decode("utf-8"))
        yield DONE_EVENT
    finally:
        abort_all(state, streams)  # a client that left mid-stream: free its blocks now
