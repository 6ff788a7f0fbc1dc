"""POST /v1/completions: prompts in, choices out, whole or as server-sent events."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import AsyncIterator, Dict, List, Optional, Tuple

from fastapi import Request
from fastapi.responses import Response

from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.server.logprobs import completion_logprobs
from pagedllm.streaming import ChoiceTracker, holdback_for
from pagedllm.server.errors import OpenAIError, bad_request
from pagedllm.server.generation import (ClientDisconnected, Prompt, abort_all, collect, merge,
                                        sampling_params, submit)
from pagedllm.server.protocol import CompletionRequest, check_extra_fields, is_token_prompt
from pagedllm.server.responses import CompletionChoice, CompletionResponse, UsageInfo
from pagedllm.server.sse import DONE_EVENT, sse_event, sse_response
from pagedllm.server.state import ServerState, new_id


def _prompts(state: ServerState, prompt) -> List[Prompt]:
    if isinstance(prompt, str):
        prompt = [prompt]
    elif is_token_prompt(prompt) and isinstance(prompt[0], int):
        prompt = [prompt]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    out = []
    for p in prompt:
        if isinstance(p, str):
            out.append(Prompt(p, state.encode(p)))
        else:
            out.append(Prompt(None, list(p)))
    return out


async def create_completion(state: ServerState, req: CompletionRequest, raw: Request,
                            arrival_time: float) -> Response:
    """Handles one /v1/completions request (see the module docstring)."""
    check_extra_fields(req)
    state.check_model(req.model)
    stops = req.stop_list()
    if req.best_of is not None and req.best_of < req.n:
        raise bad_request(f"best_of ({req.best_of}) must be >= n ({req.n})", "best_of")
    if req.stream and req.best_of not in (None, req.n):
        raise bad_request("best_of must equal n when streaming", "best_of")
    if req.echo and req.logprobs is not None:
        raise bad_request("echo together with logprobs is not supported", "echo")
    prompts = _prompts(state, req.prompt)
    longest = max(len(p.token_ids) for p in prompts)
    max_tokens = state.max_tokens(req.max_tokens, longest, prompt_param="prompt")
    params = sampling_params(state, req, max_tokens, stops, req.logprobs, req.best_of)
    request_id = new_id("cmpl")
    streams = await submit(state, request_id, prompts, params, arrival_time)
    if req.stream:
        return sse_response(_stream(state, req, request_id, prompts, streams, holdback_for(stops)))
    try:
        finals = await collect(state, raw, streams)
    except ClientDisconnected:
        return Response(status_code=499)  # nobody reads it; the requests were aborted
    return _response(state, req, request_id, prompts, finals)


def _echo_text(state: ServerState, p: Prompt) -> str:
    if p.text is not None:
        return p.text
    return state.tokenizer.decode(p.token_ids) if state.tokenizer is not None else ""


def _choice(req: CompletionRequest, i: int, comp: CompletionOutput, prefix: str) -> CompletionChoice:
    logprobs = None
    if req.logprobs is not None and comp.logprobs is not None:
        logprobs = completion_logprobs(comp.token_ids, comp.logprobs, req.logprobs, 0)
    return CompletionChoice(index=i * req.n + comp.index, text=prefix + comp.text,
                            logprobs=logprobs, finish_reason=comp.finish_reason,
                            stop_reason=comp.stop_reason)


def _response(state: ServerState, req: CompletionRequest, request_id: str,
              prompts: List[Prompt], finals: List[RequestOutput]) -> CompletionResponse:
    choices = []
    completion_tokens = 0
    for i, (p, out) in enumerate(zip(prompts, finals)):
        prefix = _echo_text(state, p) if req.echo else ""
        for comp in out.outputs:
            choices.append(_choice(req, i, comp, prefix))
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

    def chunk(choice: Optional[CompletionChoice], usage: Optional[UsageInfo] = None) -> str:
        return sse_event(CompletionResponse(id=request_id, created=created, model=state.model_name,
                                            choices=[choice] if choice else [], usage=usage))

    try:
        if req.echo:
            for i, p in enumerate(prompts):
                text = _echo_text(state, p)
                for j in range(req.n):
                    yield chunk(CompletionChoice(index=i * req.n + j, text=text))
        async for i, out in merge(streams):
            for comp in out.outputs:
                key = (i, comp.index)
                tracker = trackers[key]
                tokens[key] = len(comp.token_ids)
                d = tracker.advance(comp)
                if d is None:
                    continue
                logprobs = None
                if req.logprobs is not None and d.logprobs is not None:
                    logprobs = completion_logprobs(d.token_ids, d.logprobs, req.logprobs,
                                                   d.text_offset)
                yield chunk(CompletionChoice(index=i * req.n + comp.index, text=d.text,
                                             logprobs=logprobs, finish_reason=d.finish_reason,
                                             stop_reason=d.stop_reason))
        if req.include_usage():
            usage = UsageInfo.of(sum(len(p.token_ids) for p in prompts), sum(tokens.values()))
            yield chunk(None, usage)
        yield DONE_EVENT
    except OpenAIError as e:  # the engine stopped mid-stream
        yield sse_event(e.response().body.decode("utf-8"))
        yield DONE_EVENT
    finally:
        abort_all(state, streams)  # a client that left mid-stream: free its blocks now
