"""Running a request's prompts on the engine: sampling parameters, submission, merging the
output streams, and aborting everything when the client goes away."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import AsyncIterator, List, Optional, Tuple

from fastapi import Request

from pagedllm.engine.async_engine import EngineDeadError, RequestFailedError, RequestStream
from pagedllm.engine.llm_engine import without_request_id
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import BeamSearchParams, SamplingParams
from pagedllm.server.errors import OpenAIError, bad_request
from pagedllm.server.protocol import _SamplingRequest
from pagedllm.server.state import SAMPLING_DEFAULT_KEYS, ServerState


@dataclass
class Prompt:
    """One prompt, tokenized by the server."""

    text: Optional[str]
    token_ids: List[int]
    images: tuple = ()  # decoded images of a multimodal chat prompt (chat_images.py)


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


def sampling_params(state: ServerState, req: _SamplingRequest, max_tokens: int,
                    stops: List[str], logprobs: Optional[int] = None,
                    best_of: Optional[int] = None,
                    prompt_logprobs: Optional[int] = None) -> SamplingParams:
    """The engine's SamplingParams for a request (400 naming the field on a bad value).

    Args:
        state: the server.
        req: the request body.
        max_tokens: tokens to generate per sequence (already resolved and checked).
        stops: the stop strings.
        logprobs: top logprobs per generated token (None: none).
        best_of: sequences generated per prompt (None: n).
        prompt_logprobs: top logprobs per prompt token (None: none).
    Returns:
        The SamplingParams.

    temperature, top_p, top_k, min_p and repetition_penalty that the request does not set
    come from the checkpoint's generation_config.json when it has them, else from the
    request model's defaults (OpenAI's).
    """
    knobs = {k: (getattr(req, k) if k in req.model_fields_set
                 else state.sampling_defaults.get(k, getattr(req, k)))
             for k in SAMPLING_DEFAULT_KEYS}
    try:
        return SamplingParams(
            n=req.n, best_of=best_of, seed=req.seed, max_tokens=max_tokens,
            min_tokens=req.min_tokens, stop=stops, stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            sparse_attention=req.sparse_attention, **knobs)
    except ValueError as e:
        message = str(e).replace("SamplingParams.", "")
        field = re.match(r"[A-Za-z_][\w.]*", message)  # "top_k must be ...", "stop: ..."
        raise bad_request(message, field.group(0) if field else None) from None


# Fields beam search does not honour, with the values that mean "unset": a request that sets
# one to anything else is refused rather than run without it. Beam search ranks by cumulative
# logprob (temperature applies) and stops at EOS or max_tokens (ignore_eos applies).
_NOT_WITH_BEAM_SEARCH = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (False,),
    "prompt_logprobs": (None, 0), "stop": (None, "", []), "stop_token_ids": (None, []),
    "min_tokens": (0,), "presence_penalty": (0.0,), "frequency_penalty": (0.0,),
    "repetition_penalty": (1.0,), "top_p": (1.0,), "top_k": (-1, 0), "min_p": (0.0,),
    "sparse_attention": (None,)}


def check_beam_search(req: _SamplingRequest) -> None:
    """400 for what use_beam_search cannot be combined with: per-token logprobs, echo, and the
    sampling and stopping fields it would ignore (stop strings, stop_token_ids, min_tokens,
    penalties, top_p / top_k / min_p, sparse attention), each when set to anything but a value
    that means unset (its default, null, or an empty list)."""
    if not req.use_beam_search:
        return
    for name, unset in _NOT_WITH_BEAM_SEARCH.items():
        if name not in type(req).model_fields:
            continue
        value = getattr(req, name)
        if any(value is u or (type(value) is type(u) and value == u) for u in unset):
            continue
        raise bad_request(f"use_beam_search cannot be combined with {name} (beam search ranks "
                          "beams by their logprobs and stops at EOS or max_tokens; leave "
                          f"{name} unset)", name)


def beam_params(req: _SamplingRequest, params: SamplingParams) -> Optional[BeamSearchParams]:
    """The BeamSearchParams of a use_beam_search request (None otherwise): width
    max(n, best_of), the request's max_tokens, ignore_eos, temperature and length_penalty."""
    if not req.use_beam_search:
        return None
    try:
        return BeamSearchParams(beam_width=max(params.n, params.best_of),
                                max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
                                temperature=params.temperature,
                                length_penalty=float(req.length_penalty))
    except ValueError as e:
        raise bad_request(str(e), "use_beam_search") from None


def truncate(token_ids: List[int], keep: Optional[int], max_model_len: int) -> List[int]:
    """The last `keep` tokens of a prompt (vLLM's truncate_prompt_tokens; -1: max_model_len;
    None: all)."""
    if keep is None:
        return token_ids
    keep = max_model_len if keep == -1 else keep
    return token_ids[-keep:] if keep > 0 else token_ids


async def submit(state: ServerState, base_id: str, prompts: List[Prompt],
                 params: SamplingParams, arrival_time: float,
                 extra_key: int = 0,
                 beam: Optional[BeamSearchParams] = None,
                 prompt_field: str = "prompt") -> List[RequestStream]:
    """Adds one engine request per prompt (ids base_id-0, base_id-1, ...).

    Args:
        state: the server.
        base_id: the request id the engine ids derive from.
        prompts: the tokenized prompts.
        params: their sampling parameters.
        arrival_time: when the HTTP request arrived (time.monotonic()).
        extra_key: the prefix-cache namespace (see cache_salt.py).
        beam: run beam searches instead (their streams yield the n best beams once).
        prompt_field: the body field a refused prompt is reported under ("messages": chat).
    Returns:
        One stream per prompt, in order.

    Raises:
        OpenAIError: 400 when the engine rejects a prompt (those already added are aborted),
            503 when the engine is not running.
    """
    def engine_prompt(p: Prompt) -> dict:
        prompt = {"prompt_token_ids": p.token_ids}
        if p.images:
            prompt["multi_modal_data"] = {"image": list(p.images)}
        if p.text is not None:
            prompt["prompt"] = p.text
        return prompt

    ids = [f"{base_id}-{i}" for i in range(len(prompts))]
    # All prompts are posted at once (the engine thread takes them in one step), then awaited.
    try:
        results = await asyncio.gather(
            *(state.engine.add_request(rid, engine_prompt(p), params, arrival_time=arrival_time,
                                       extra_key=extra_key, beam=beam, beam_n=params.n,
                                       group=base_id)
              for rid, p in zip(ids, prompts)),
            return_exceptions=True)
    except BaseException:  # cancelled (the client left): none of them may stay behind
        for rid in ids:
            state.engine.abort(rid)
        raise
    streams = [r for r in results if isinstance(r, RequestStream)]
    failed = [(i, r) for i, r in enumerate(results) if not isinstance(r, RequestStream)]
    if not failed:
        return streams
    abort_all(state, streams)
    i, e = failed[0]
    if isinstance(e, ValueError):
        where = f"prompt {i}: " if len(prompts) > 1 else ""
        message = without_request_id(str(e)).replace("SamplingParams.", "")
        raise bad_request(where + message, prompt_field) from None
    if isinstance(e, EngineDeadError):
        raise OpenAIError(503, f"the engine is not running ({e})") from None
    raise e


def abort_all(state: ServerState, streams: List[RequestStream]) -> None:
    """Aborts every stream's request that has not finished."""
    for s in streams:
        if not s.finished:
            state.engine.abort(s.request_id)


async def merge(streams: List[RequestStream]) -> AsyncIterator[Tuple[int, RequestOutput]]:
    """Yields (stream index, output) from all streams as outputs arrive.

    Raises:
        OpenAIError: 503 if the engine died or shut down before a stream finished.
    """
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
            queue.put_nowait((i, None))
        except (EngineDeadError, RequestFailedError) as e:
            queue.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
                if streams[i].aborted:
                    raise OpenAIError(503, "the request was aborted: the server is shutting down")
            elif isinstance(item, EngineDeadError):
                raise OpenAIError(503, str(item))
            elif isinstance(item, RequestFailedError):
                raise OpenAIError(500, f"the engine failed the request: {item}")
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def collect(state: ServerState, raw: Request, streams: List[RequestStream]) -> List[RequestOutput]:
    """The final output of every stream, aborting them all if the client disconnects first."""
    finals: List[Optional[RequestOutput]] = [None] * len(streams)

    async def gather() -> None:
        async for i, out in merge(streams):
            finals[i] = out

    work = asyncio.ensure_future(gather())
    watch = asyncio.ensure_future(_disconnected(raw))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            raise ClientDisconnected()
        work.result()  # re-raises what gather raised
        return finals  # type: ignore[return-value]  # every stream finished
    finally:
        watch.cancel()
        work.cancel()
        abort_all(state, streams)


async def _disconnected(raw: Request) -> None:
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return


def now() -> float:
    """The engine's clock (time.monotonic), for arrival times."""
    return time.monotonic()
