"""Timeline traces of engine steps: spans recorded cheaply, written as Chrome/Perfetto JSON, and
mirrored as NVTX ranges on CUDA; profiler windows over chosen steps.

Per step (names as they appear in the trace; `kv.*` only when the step moves blocks, `layer i`
only with profile_layers, `detokenize` only when the model has a tokenizer):

    step                      args: step number
      schedule                the scheduler: admission, preemption, the KV transfer plan
      execute                 the executor call
        kv.swap_out | kv.swap_in | kv.load | kv.copy    args: blocks (+ us_per_block)
        prepare_inputs        the step's arrays as device tensors, attention metadata
        encoder               the image encoder (steps with images)
        forward               the model
          layer 0 .. layer L-1
        logits                lm_head on the sampled rows, copied to the host
      numerics                check_numerics (only when on)
      sample                  the draws
      update                  tokens, stop rules, outputs
        detokenize            first to last token detokenized; args: tokens, busy_us
    kv.store                  (on the transfer thread, overlapping the next step)

The hot path: `begin` is one perf_counter_ns() (plus an NVTX push on CUDA), `end` one more and
one tuple appended to a list; no dict, no string formatting. Events reach the file
(engine/trace_writer.py) in batches, at the end of a step that filled FLUSH_EVENTS or came
FLUSH_INTERVAL_NS after the last batch, and at stop (also a trace never stopped: when its engine
is collected, or at interpreter exit). Times are host times: on a
GPU, `forward` is the launch of its kernels and `logits` includes waiting for them (the NVTX
ranges in an nsys timeline show the device side).
"""

from __future__ import annotations

import logging
import threading
import weakref
from threading import get_ident
from time import perf_counter_ns
from typing import List, Optional

from pagedllm.engine.profile_windows import (CudaProfilerWindow, TorchProfilerWindow,
                                             cuda_profiler_module)
from pagedllm.engine.trace_options import TraceOptions
from pagedllm.engine.trace_writer import ChromeTraceWriter, Event

logger = logging.getLogger("pagedllm")

STEP_SPANS = ("schedule", "execute", "sample", "update")  # the engine's spans, in step order
WORKER_SPANS = ("prepare_inputs", "forward", "logits")    # inside execute, in order
FLUSH_EVENTS = 4096  # a batch written to the file at the end of a step, or when
FLUSH_INTERVAL_NS = 1_000_000_000  # this long has passed since the last write (a quiet server)


def nvtx_module(on_cuda: bool):
    """torch.cuda.nvtx when the engine runs on CUDA, else None (tests replace this)."""
    if not on_cuda:
        return None
    import torch.cuda.nvtx

    return torch.cuda.nvtx


class _NullSpan:
    """The span of an untraced step: nothing."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


NULL_SPAN = _NullSpan()


class NullRecorder:
    """The recorder of an untraced engine: every call does nothing."""

    enabled = False

    def begin(self, name: str) -> int:
        return 0

    def end(self, name: str, t0: int, args: Optional[dict] = None, cat: str = "engine") -> None:
        pass

    def span(self, name: str, args: Optional[dict] = None, cat: str = "engine"):
        return NULL_SPAN

    def add(self, name: str, t0: int, t1: int, args: Optional[dict] = None,
            cat: str = "engine") -> None:
        pass


NULL_RECORDER = NullRecorder()


class _Span:
    """`with recorder.span(name):` -- SpanRecorder.begin/end inlined (the hot path)."""

    __slots__ = ("rec", "name", "args", "cat", "t0")

    def __init__(self, rec, name, args, cat):
        self.rec, self.name, self.args, self.cat = rec, name, args, cat

    def __enter__(self):
        rec = self.rec
        if rec.nvtx is not None:
            rec.nvtx.range_push(self.name)
            rec.depth += 1
        self.t0 = perf_counter_ns()
        return self

    def __exit__(self, *exc) -> bool:
        t1 = perf_counter_ns()
        rec = self.rec
        if rec.record:
            rec.events.append((self.name, self.cat, self.t0, t1, get_ident(), self.args))
        if rec.nvtx is not None:
            rec.nvtx.range_pop()
            rec.depth -= 1
        return False


class SpanRecorder:
    """Collects spans from the engine and its in-process worker (any thread).

    Args:
        record: keep the spans (for the JSON trace); False: NVTX ranges only.
        nvtx: a module with range_push / range_pop (torch.cuda.nvtx), or None.
    """

    enabled = True

    def __init__(self, record: bool, nvtx=None):
        self.record = record
        self.nvtx = nvtx
        self.events: List[Event] = []
        self.depth = 0  # open NVTX ranges
        self._drain_lock = threading.Lock()  # two drains at once would lose events

    def begin(self, name: str) -> int:
        """Opens a span; returns its start (perf_counter_ns)."""
        if self.nvtx is not None:
            self.nvtx.range_push(name)
            self.depth += 1
        return perf_counter_ns()

    def end(self, name: str, t0: int, args: Optional[dict] = None, cat: str = "engine") -> None:
        """Closes the span `begin(name)` opened at t0."""
        t1 = perf_counter_ns()
        if self.record:
            self.events.append((name, cat, t0, t1, get_ident(), args))
        if self.nvtx is not None:
            self.nvtx.range_pop()
            self.depth -= 1

    def span(self, name: str, args: Optional[dict] = None, cat: str = "engine") -> _Span:
        """`with recorder.span(name):` (closed on exceptions too)."""
        return _Span(self, name, args, cat)

    def add(self, name: str, t0: int, t1: int, args: Optional[dict] = None,
            cat: str = "engine") -> None:
        """Records a span measured elsewhere (no NVTX range)."""
        if self.record:
            self.events.append((name, cat, t0, t1, get_ident(), args))

    def unwind(self, depth: int) -> None:
        """Pops NVTX ranges left open by an exception, down to `depth`."""
        while self.nvtx is not None and self.depth > depth:
            self.nvtx.range_pop()
            self.depth -= 1

    def drain(self) -> List[Event]:
        """Takes the recorded events (appends racing with it stay for the next drain)."""
        with self._drain_lock:
            n = len(self.events)
            batch = self.events[:n]
            del self.events[:n]
            return batch


class DetokenizeClock:
    """Times the detokenizer calls of one step (StopChecker.append_text), as one span from the
    first to the last call, with the time actually spent inside as busy_us."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.first = self.last = self.busy = self.count = 0

    def add(self, t0: int) -> None:
        """One call that started at t0 (perf_counter_ns) ends now."""
        t1 = perf_counter_ns()
        if not self.count:
            self.first = t0
        self.last = t1
        self.busy += t1 - t0
        self.count += 1

    def emit(self, recorder: SpanRecorder) -> None:
        """Records the step's detokenize span (if any token was detokenized) and resets."""
        if self.count:
            recorder.add("detokenize", self.first, self.last,
                         {"tokens": self.count, "busy_us": round(self.busy / 1000, 1)})
            self.reset()


class StepTracer:
    """One trace: the JSON writer, the recorder, and the profiler windows.

    Args:
        options: what to record.
        on_cuda: the engine's device is a GPU (NVTX ranges, CUDA profiler windows).
        synchronize: waits for the device (CUDA windows), or None on the CPU.
    Raises:
        ValueError: the trace directory does not exist, or profile_cuda_steps without CUDA.
    """

    def __init__(self, options: TraceOptions, on_cuda: bool, synchronize=None):
        self.options = options
        self.step = 0
        self.recorder = SpanRecorder(record=options.path is not None, nvtx=nvtx_module(on_cuda))
        self.clock = DetokenizeClock()
        self.cuda_window = None
        if options.cuda_steps is not None:
            profiler = cuda_profiler_module() if on_cuda else None
            if profiler is None or self.recorder.nvtx is None:
                raise ValueError("profile_cuda_steps needs the engine on a CUDA device "
                                 "(device='cuda')")
            self.cuda_window = CudaProfilerWindow(options.cuda_steps, profiler,
                                                  synchronize or (lambda: None))
        self.torch_window = None
        if options.torch_steps is not None:
            self.torch_window = TorchProfilerWindow(options.torch_steps,
                                                    options.torch_trace_path, on_cuda)
        self.writer = (ChromeTraceWriter(options.path, perf_counter_ns())
                       if options.path is not None else None)
        # The spans still buffered reach the file at close(), or when this tracer (with its
        # engine) is collected or the interpreter exits without stop_trace() / close(): the
        # finalizer holds the writer and the recorder, never the tracer or the engine, and
        # runs once.
        self._finalizer = (weakref.finalize(self, _write_buffered, self.writer, self.recorder)
                           if self.writer is not None else None)
        self._flushed_at = perf_counter_ns()
        self._windows = [w for w in (self.cuda_window, self.torch_window) if w is not None]

    @property
    def path(self) -> Optional[str]:
        return self.options.path

    def begin_step(self) -> tuple:
        """Opens the windows that start here and the step span; returns what end_step needs."""
        for w in self._windows:
            w.before_step(self.step)
        depth = self.recorder.depth
        return self.recorder.begin("step"), depth

    def end_step(self, token: tuple) -> None:
        """Closes the step span and the windows that end here; flushes a full buffer."""
        t0, depth = token
        rec = self.recorder
        rec.unwind(depth + 1)  # ranges an exception left open inside the step
        self.clock.emit(rec)
        rec.end("step", t0, {"step": self.step})
        for w in reversed(self._windows):
            w.after_step(self.step)
        self.step += 1
        if self.writer is not None and (len(rec.events) >= FLUSH_EVENTS or
                                        perf_counter_ns() - self._flushed_at >= FLUSH_INTERVAL_NS):
            self.writer.write(rec.drain())
            self._flushed_at = perf_counter_ns()

    def close(self) -> List[str]:
        """Closes the windows and writes what is buffered; the paths written."""
        for w in self._windows:
            w.close()
        written = []
        if self.writer is not None:
            self._finalizer()  # the buffered spans, then the file closed (once)
            written.append(self.writer.path)
            logger.info("trace of %d steps (%d spans) written to %s", self.step,
                        self.writer.num_events, self.writer.path)
        if self.torch_window is not None and self.torch_window.written:
            written.append(self.torch_window.written)
        return written


def _write_buffered(writer: ChromeTraceWriter, recorder: SpanRecorder) -> None:
    """Writes the spans still buffered and closes the trace file (StepTracer's finalizer)."""
    try:
        writer.write(recorder.drain())
    finally:
        writer.close()
