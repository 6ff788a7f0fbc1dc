"""AsyncLLMEngine: the synchronous LLMEngine driven by one background thread, for asyncio servers.

LLMEngine is not thread-safe, so exactly one thread (the engine thread) ever touches it. Other
threads talk to it through an inbox guarded by a condition variable:

    event loop                         engine thread
    ----------                         -------------
    add_request() -> inbox  ------->   engine.add_request()   (ValueError -> the caller)
    abort()       -> inbox  ------->   engine.abort_request() (blocks freed, stream closed)
                                       engine.step() while there is work, else sleep on the
    RequestStream <- call_soon_threadsafe <- outputs          condition until the inbox fills

A request added while others run joins the running batch at the next step. Outputs are
cumulative (vLLM's RequestOutput), so a stream keeps only the newest one: a slow reader skips
intermediate states but never loses tokens. After every iteration the thread publishes a
snapshot of the KV-cache and request figures (``stats()``), which any thread may read.

Thread-safety: add_request/generate must be awaited on an event loop; abort(), stats(),
start() and shutdown() may be called from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

from pagedllm.outputs import BeamSearchOutput, RequestOutput, beam_request_output
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger("pagedllm")


class EngineDeadError(RuntimeError):
    """The engine thread stopped (shut down, or a bug escaped a step); no request can run."""


class RequestFailedError(RuntimeError):
    """The engine failed one request (an error inside its step); the engine carries on."""


class RequestStream:
    """The outputs of one request, as an async iterator of cumulative RequestOutputs.

    Iteration ends after the finished output, or early (without one) when the request was
    aborted; it raises EngineDeadError if the engine failed meanwhile. Only the event loop
    that created the stream may iterate it.
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.loop = loop
        self.finished = False      # the finished output was delivered
        self.aborted = False       # closed without a finished output
        self._latest: Optional[RequestOutput] = None
        self._closed = False
        self._error: Optional[BaseException] = None
        self._event = asyncio.Event()

    # Called on the stream's event loop (scheduled by the engine thread).
    def _put(self, output: RequestOutput) -> None:
        if self._closed:
            return
        if output.error is not None:
            self._close(RequestFailedError(output.error))
            return
        self._latest = output
        if output.finished:
            self.finished = True
            self._closed = True
        self._event.set()

    def _close(self, error: Optional[BaseException] = None) -> None:
        if self._closed:
            return
        self._closed = True
        self.aborted = error is None
        self._error = error
        self._latest = None if error is not None else self._latest
        self._event.set()

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        while True:
            if self._latest is not None:
                out, self._latest = self._latest, None
                return out
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._event.clear()
            await self._event.wait()


@dataclass
class _Add:
    request_id: str
    prompt: Any
    params: SamplingParams
    arrival_time: Optional[float]
    extra_key: int
    stream: RequestStream
    accepted: concurrent.futures.Future
    beam: Any = None      # BeamSearchParams: a beam search returning its best `beam_n` beams
    beam_n: int = 1
    group: Optional[str] = None


class AsyncLLMEngine:
    """Runs an LLMEngine on a background thread and serves its requests to asyncio code.

    Args:
        engine: the synchronous engine (an LLMEngine, or anything with its add_request / step /
            abort_request / has_unfinished_requests / kv_cache_stats API). The engine thread
            becomes its only user.
        on_outputs: called on the engine thread with (outputs, now) after every step
            (metrics); must not touch the engine.
        on_abort: called on the engine thread with a request id when a live request is aborted.
    """

    def __init__(self, engine: Any,
                 on_outputs: Optional[Callable[[List[RequestOutput], float], None]] = None,
                 on_abort: Optional[Callable[[str], None]] = None):
        self.engine = engine
        self.on_outputs = on_outputs
        self.on_abort = on_abort
        self._cond = threading.Condition()
        self._inbox: List[Any] = []            # _Add items and request ids to abort
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._streams: Dict[str, RequestStream] = {}   # engine thread only
        self._beams: Dict[str, tuple] = {}   # beam searches: id -> (prompt, ids, n); engine thread
        self._dead: Optional[BaseException] = None
        self._stats: Dict[str, Any] = {}
        self._publish_stats()

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Starts the engine thread (idempotent)."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="pagedllm-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: Optional[float] = None) -> None:
        """Stops the engine thread after its current step; open streams end as aborted."""
        with self._cond:
            self._stop = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def is_running(self) -> bool:
        """True while the engine thread is alive and has not failed."""
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def dead_error(self) -> Optional[BaseException]:
        """The exception that stopped the engine thread, if one did."""
        return self._dead

    # --- requests (event loop side) -----------------------------------------------------------
    async def add_request(self, request_id: str, prompt: Any, params: SamplingParams,
                          arrival_time: Optional[float] = None,
                          extra_key: int = 0, beam: Any = None,
                          beam_n: int = 1, group: Optional[str] = None) -> RequestStream:
        """Queues a request and waits until the engine accepted it.

        Args:
            request_id: a unique id.
            prompt: as for LLMEngine.add_request (text, token ids, or a dict).
            params: sampling parameters.
            arrival_time: time.monotonic() when the request arrived (for TTFT metrics).
            extra_key: prefix-cache namespace.
            beam: BeamSearchParams to run a beam search instead (params then only serves the
                server's bookkeeping); its stream yields one finished output whose
                completions are the `beam_n` best beams.
            beam_n: beams returned.
            group: fair-share key (LLMEngine.add_request).
        Returns:
            The request's output stream.
        Raises:
            ValueError: the engine rejected the request (it can never run).
            EngineDeadError: the engine thread is not running.
        """
        if self._dead is not None or self._stop:
            raise EngineDeadError(self._dead_message())
        self.start()
        stream = RequestStream(request_id, asyncio.get_running_loop())
        accepted: concurrent.futures.Future = concurrent.futures.Future()
        self._post(_Add(request_id, prompt, params, arrival_time, extra_key, stream, accepted,
                        beam, beam_n, group))
        try:
            await asyncio.wrap_future(accepted)
        except asyncio.CancelledError:
            self.abort(request_id)  # in case the engine took it before the cancellation
            raise
        return stream

    async def generate(self, request_id: str, prompt: Any, params: SamplingParams,
                       arrival_time: Optional[float] = None) -> AsyncIterator[RequestOutput]:
        """add_request() and iterate its stream; aborts the request if the caller stops early."""
        stream = await self.add_request(request_id, prompt, params, arrival_time)
        try:
            async for out in stream:
                yield out
        finally:
            if not stream.finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Aborts a request (unknown or finished ids are ignored). Safe from any thread."""
        self._post(str(request_id))

    def stats(self) -> Dict[str, Any]:
        """The latest snapshot: LLMEngine.kv_cache_stats() plus num_prompt_tokens,
        num_generation_tokens and num_steps (cumulative), taken after the last step."""
        return self._stats

    def _post(self, item: Any) -> None:
        with self._cond:
            if not self._stop:
                self._inbox.append(item)
                self._cond.notify()
                return
        # The thread is stopping or gone: nobody will read the inbox again.
        if isinstance(item, _Add) and item.accepted.set_running_or_notify_cancel():
            item.accepted.set_exception(EngineDeadError(self._dead_message()))

    def _dead_message(self) -> str:
        if self._dead is not None:
            return f"the engine stopped after an error: {self._dead!r}"
        return "the engine is shut down"

    # --- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._stop or self.engine.has_unfinished_requests()):
                        self._cond.wait()
                    if self._stop:
                        break
                    items, self._inbox = self._inbox, []
                for item in items:
                    if isinstance(item, _Add):
                        self._apply_add(item)
                    else:
                        self._apply_abort(item)
                outputs = self.engine.step() if self.engine.has_unfinished_requests() else []
                if self._beams:
                    outputs.extend(self._finished_beams())
                # Stats first: a client holding its final output then sees them up to date.
                self._publish_stats()
                self._deliver(outputs)
        except BaseException as e:  # a bug in a step: fail every request, refuse new ones
            logger.exception("engine thread failed; no further requests will run")
            self._dead = e
        finally:
            self._stop_trace()
            self._close_all()

    def _stop_trace(self) -> None:
        """Writes a trace that LLMEngine.start_trace armed (on this thread, which ran the
        steps: the profiler must stop where it started)."""
        stop = getattr(self.engine, "stop_trace", None)
        if stop is None:
            return
        try:
            stop()
        except Exception:  # noqa: BLE001 - a trace must not hide the engine's own outcome
            logger.exception("writing the step trace failed")

    def _apply_add(self, item: _Add) -> None:
        if not item.accepted.set_running_or_notify_cancel():
            return  # the caller went away before the engine saw it
        try:
            if item.beam is not None:
                self.engine.add_beam_request(item.request_id, item.prompt, item.beam,
                                             arrival_time=item.arrival_time,
                                             extra_key=item.extra_key, group=item.group)
                req = self.engine.requests[item.request_id]
                self._beams[item.request_id] = (req.prompt, list(req.prompt_token_ids),
                                                item.beam_n)
            else:
                self.engine.add_request(item.request_id, item.prompt, item.params,
                                        arrival_time=item.arrival_time, extra_key=item.extra_key,
                                        group=item.group)
        except Exception as e:  # ValueError: the request can never run
            item.accepted.set_exception(e)
            return
        self._streams[item.request_id] = item.stream
        item.accepted.set_result(None)

    def _finished_beams(self) -> List[RequestOutput]:
        """Outputs of the beam searches that finished (failed ones carry their error)."""
        done = []
        for rid, (prompt, ids, n) in list(self._beams.items()):
            try:
                res = self.engine.beam_search_result(rid)
            except RuntimeError as e:  # the engine failed the request
                del self._beams[rid]
                done.append(beam_request_output(rid, prompt, ids, BeamSearchOutput([]), 0, str(e)))
                continue
            if res is not None:
                del self._beams[rid]
                done.append(beam_request_output(rid, prompt, ids, res, n))
        return done

    def _apply_abort(self, request_id: str) -> None:
        self._beams.pop(request_id, None)
        stream = self._streams.pop(request_id, None)
        self.engine.abort_request(request_id)
        if stream is None:
            return
        if self.on_abort is not None:
            self.on_abort(request_id)
        _call_soon(stream.loop, stream._close)

    def _deliver(self, outputs: List[RequestOutput]) -> None:
        now = time.monotonic()
        if self.on_outputs is not None and outputs:
            self.on_outputs(outputs, now)
        by_loop: Dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            stream = (self._streams.pop(out.request_id, None) if out.finished
                      else self._streams.get(out.request_id))
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream, out))
        for loop, pairs in by_loop.items():  # one wake-up per loop per step
            _call_soon(loop, _dispatch, pairs)

    def _publish_stats(self) -> None:
        stats = dict(self.engine.kv_cache_stats())
        stats["num_prompt_tokens"] = self.engine.num_prompt_tokens
        stats["num_generation_tokens"] = self.engine.num_generation_tokens
        stats["num_steps"] = getattr(self.engine, "num_steps", 0)
        self._stats = stats  # one reference assignment: readers see a whole snapshot

    def _close_all(self) -> None:
        error = EngineDeadError(self._dead_message()) if self._dead is not None else None
        with self._cond:
            items, self._inbox = self._inbox, []
            self._stop = True
        for item in items:
            if isinstance(item, _Add) and item.accepted.set_running_or_notify_cancel():
                item.accepted.set_exception(EngineDeadError(self._dead_message()))
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            _call_soon(stream.loop, stream._close, error)
        if self._dead is None:  # a clean shutdown: free what the requests held
            try:
                self.engine.abort_request(list(streams))
                self._publish_stats()
            except Exception:  # the engine is going away anyway
                logger.exception("aborting requests at shutdown failed")


def _dispatch(pairs) -> None:
    for stream, out in pairs:
        stream._put(out)


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nobody is listening any more
        pass
