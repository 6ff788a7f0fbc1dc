"""POST /v1/completions: prompts in, choices out, whole or as server-sent events.

``echo`` with ``logprobs`` returns the prompt's tokens with their logprobs before the generated
ones (the first prompt token has none: null), as OpenAI's legacy API and vLLM do; this is what
lm-evaluation-harness scores multiple-choice tasks with. ``max_tokens: 0`` (only with echo)
scores the prompt without generating: the engine runs one token, which is dropped.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import replace
from typing import AsyncIterator, Dict, List, Optional, Tuple

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.server.cache_salt import request_cache_key
from pagedllm.server.errors import OpenAIError, bad_request
from pagedllm.server.generation import (ClientDisconnected, Prompt, abort_all, beam_params,
                                        check_beam_search,
                                        collect, merge, sampling_params, submit, truncate)
from pagedllm.server.echo import echo_text, outputs_of, prompt_echo_logprobs
from pagedllm.server.ignored_fields import ignored_fields_header
from pagedllm.server.logprobs import completion_logprobs, concat, prompt_logprobs
from pagedllm.server.protocol import CompletionRequest, is_token_prompt
from pagedllm.server.responses import CompletionChoice, CompletionResponse, UsageInfo
from pagedllm.server.sse import DONE_EVENT, sse_event, sse_response
from pagedllm.server.state import ServerState, new_id, off_loop_if_large
from pagedllm.streaming import ChoiceTracker, holdback_for


def _prompts(state: ServerState, req: CompletionRequest) -> List[Prompt]:
    prompt = req.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    elif is_token_prompt(prompt) and isinstance(prompt[0], int):
        prompt = [prompt]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if len(prompt) > state.settings.max_prompts_per_request:  # before tokenizing them all
        state.check_limits(len(prompt), 1, 1, None, 0, None)
    out = []
    for p in prompt:
        text, ids = (p, state.encode(p, req.add_special_tokens)) if isinstance(p, str) else (None, list(p))
        kept = truncate(ids, req.truncate_prompt_tokens, state.max_model_len)
        out.append(Prompt(text if len(kept) == len(ids) else None, kept))
    return out


def _check(req: CompletionRequest) -> None:
    check_beam_search(req)
    if req.best_of is not None and req.best_of < req.n:
        raise bad_request(f"best_of ({req.best_of}) must be >= n ({req.n})", "best_of")
    if req.stream and req.best_of not in (None, req.n):
        raise bad_request("best_of must equal n when streaming", "best_of")
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens: 0 is only allowed with echo (score the prompt without "
                          "generating); ask for at least 1 token", "max_tokens")
    if req.stream and req.prompt_logprobs is not None:
        raise bad_request("prompt_logprobs is not available when streaming (use echo with "
                          "logprobs)", "prompt_logprobs")


async def create_completion(state: ServerState, req: CompletionRequest, raw: Request,
                            arrival_time: float) -> Response:
    """Handles one /v1/completions request (see the module docstring).

    Args:
        state: the server.
        req: the parsed body.
        raw: the HTTP request (disconnect detection, bearer token for cache salting).
        arrival_time: when it arrived (time.monotonic()).
    Returns:
        A JSON response, or a text/event-stream one when streaming.
    """
    headers = ignored_fields_header(req, state.settings.strict_fields, "/v1/completions")
    state.check_model(req.model)
    stops = req.stop_list()
    _check(req)
    text = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    chars = sum(len(p) for p in text if isinstance(p, str)) if isinstance(text, list) else 0
    prompts = await off_loop_if_large(chars, _prompts, state, req)
    longest = max(len(p.token_ids) for p in prompts)
    score_only = req.max_tokens == 0
    max_tokens = 1 if score_only else state.max_tokens(req.max_tokens, longest, prompt_param="prompt")
    echo_k = req.logprobs if req.echo else None
    want_prompt_lp = [k for k in (req.prompt_logprobs, echo_k) if k is not None]
    engine_prompt_lp = max(want_prompt_lp) if want_prompt_lp else None
    state.check_limits(len(prompts), max(req.n, req.best_of or 1),
                       0 if score_only else max_tokens, req.logprobs,
                       sum(len(p.token_ids) for p in prompts), engine_prompt_lp)
    params = sampling_params(state, req, max_tokens, stops, req.logprobs, req.best_of,
                             engine_prompt_lp)
    if score_only:
        params = replace(params, min_tokens=0)
    request_id = new_id("cmpl")
    key = request_cache_key(raw, req.cache_salt, state.settings.cache_salt_by_api_key)
    streams = await submit(state, request_id, prompts, params, arrival_time, key,
                           beam_params(req, params))
    if req.stream:
        events = _stream(state, req, request_id, prompts, streams, holdback_for(stops))
        return sse_response(events, headers)
    try:
        finals = await collect(state, raw, streams)
    except ClientDisconnected:
        return Response(status_code=499)  # nobody reads it; the requests were aborted
    body = _response(state, req, request_id, prompts, finals)
    return JSONResponse(body.model_dump(), headers=headers)


def _choice(state: ServerState, req: CompletionRequest, i: int, p: Prompt, out: RequestOutput,
            comp: CompletionOutput) -> CompletionChoice:
    prefix = echo_text(state, p) if req.echo else ""
    logprobs = None
    if req.logprobs is not None and comp.logprobs is not None:
        logprobs = completion_logprobs(comp.token_ids, comp.logprobs, req.logprobs, len(prefix),
                                       req.return_tokens_as_token_ids)
        if req.echo:
            logprobs = concat(prompt_echo_logprobs(state, req, p, out), logprobs)
    plp = None
    if req.prompt_logprobs is not None:
        plp = prompt_logprobs(p.token_ids, out.prompt_logprobs, req.prompt_logprobs)
    return CompletionChoice(index=i * req.n + comp.index, text=prefix + comp.text,
                            logprobs=logprobs, finish_reason=comp.finish_reason,
                            stop_reason=comp.stop_reason, prompt_logprobs=plp)


def _response(state: ServerState, req: CompletionRequest, request_id: str,
              prompts: List[Prompt], finals: List[RequestOutput]) -> CompletionResponse:
    choices = []
    completion_tokens = 0
    for i, (p, out) in enumerate(zip(prompts, finals)):
        for comp in outputs_of(req, out):
            choices.append(_choice(state, req, i, p, out, comp))
            completion_tokens += len(comp.token_ids)
    choices.sort(key=lambda c: c.index)
    usage = UsageInfo.of(sum(len(p.token_ids) for p in prompts), completion_tokens)
    return CompletionResponse(id=request_id, model=state.model_name, choices=choices, usage=usage)


async def _stream(state: ServerState, req: CompletionRequest, request_id: str,
                  prompts: List[Prompt], streams, holdback: int) -> AsyncIterator[str]:
    created = int(time.time())
    trackers: Dict[Tuple[int, int], ChoiceTracker] = defaultdict(
        lambda: ChoiceTracker(holdback))
    tokens: Dict[Tuple[int, int], int] = {}
    prompt_tokens = sum(len(p.token_ids) for p in prompts)
    echoed = set()

    def chunk(choice: Optional[CompletionChoice], usage: Optional[UsageInfo] = None) -> str:
        if usage is None and choice is not None and req.continuous_usage():
            usage = UsageInfo.of(prompt_tokens, sum(tokens.values()))
        return sse_event(CompletionResponse(id=request_id, created=created, model=state.model_name,
                                            choices=[choice] if choice else [], usage=usage))

    def echo(i: int, out: Optional[RequestOutput]):
        echoed.add(i)
        text = echo_text(state, prompts[i])
        logprobs = prompt_echo_logprobs(state, req, prompts[i], out) if out is not None else None
        for j in range(req.n):
            yield chunk(CompletionChoice(index=i * req.n + j, text=text, logprobs=logprobs))

    try:
        if req.echo and req.logprobs is None:  # the text is known: send it at once
            for i in range(len(prompts)):
                for event in echo(i, None):
                    yield event
        async for i, out in merge(streams):
            if req.echo and i not in echoed:  # with logprobs: they come with the first output
                for event in echo(i, out):
                    yield event
            for comp in outputs_of(req, out):
                key = (i, comp.index)
                tracker = trackers[key]
                tokens[key] = len(comp.token_ids)
                d = tracker.advance(comp)
                if d is None:
                    continue
                logprobs = None
                if req.logprobs is not None and d.logprobs is not None:
                    offset = d.text_offset + (len(echo_text(state, prompts[i])) if req.echo else 0)
                    logprobs = completion_logprobs(d.token_ids, d.logprobs, req.logprobs, offset,
                                                   req.return_tokens_as_token_ids)
                yield chunk(CompletionChoice(index=i * req.n + comp.index, text=d.text,
                                             logprobs=logprobs, finish_reason=d.finish_reason,
                                             stop_reason=d.stop_reason))
        if req.include_usage():
            yield chunk(None, UsageInfo.of(prompt_tokens, sum(tokens.values())))
        yield DONE_EVENT
    except OpenAIError as e:  # the engine stopped mid-stream
        yield sse_event(e.response().body.decode("utf-8"))
        yield DONE_EVENT
    finally:
        abort_all(state, streams)  # a client that left mid-stream: free its blocks now
