"""Profiler windows over engine steps [start, end): torch.profiler, and cudaProfilerStart/Stop.

Both are opened at the beginning of step `start` and closed at the end of step `end - 1` (or
when the trace stops, if the run ends first), on the thread that runs the steps (Kineto wants a
capture started and stopped on one thread).

- TorchProfilerWindow: torch.profiler with CPU activities (and CUDA on a GPU), every step inside
  annotated with record_function("pagedllm.step N"); exported as a Chrome trace JSON.
- CudaProfilerWindow: torch.cuda.profiler.start()/stop(), i.e. cudaProfilerStart/Stop, so that
  `nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop ...` records exactly
  those steps (with the NVTX ranges of engine/tracing.py).
"""

from __future__ import annotations

import logging
from typing import Optional

from pagedllm.engine.trace_options import StepWindow

logger = logging.getLogger("pagedllm")


def cuda_profiler_module():
    """torch.cuda.profiler (start/stop wrap cudaProfilerStart/Stop); tests replace it."""
    import torch.cuda.profiler

    return torch.cuda.profiler


class _Window:
    """Opens at step `start`, closes after step `end - 1`."""

    def __init__(self, window: StepWindow):
        self.start, self.end = window
        self.is_open = False
        self.done = False

    def before_step(self, step: int) -> None:
        """Opens the window if `step` is inside it (once)."""
        if not self.done and not self.is_open and self.start <= step < self.end:
            self._open(step)
            self.is_open = True

    def after_step(self, step: int) -> None:
        """Closes the window after its last step."""
        if self.is_open and step >= self.end - 1:
            self.close()

    def close(self) -> None:
        """Closes the window if open (end of the run)."""
        if self.is_open:
            self.is_open = False
            self.done = True
            self._close()

    def _open(self, step: int) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError


class TorchProfilerWindow(_Window):
    """A torch.profiler capture of steps [start, end).

    Args:
        window: (start, end) engine steps.
        path: the Chrome trace JSON to export.
        cuda: also record CUDA activities.
    """

    def __init__(self, window: StepWindow, path: str, cuda: bool):
        super().__init__(window)
        self.path = path
        self.cuda = cuda
        self.written: Optional[str] = None
        self._prof = None
        self._mark = None

    def _open(self, step: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(activities=activities)
        self._prof.__enter__()
        logger.info("torch.profiler capture opened at step %d", step)

    def before_step(self, step: int) -> None:
        super().before_step(step)
        if self.is_open:
            from torch.profiler import record_function

            self._mark = record_function(f"pagedllm.step {step}")
            self._mark.__enter__()

    def after_step(self, step: int) -> None:
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        super().after_step(step)

    def _close(self) -> None:
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(self.path)
        self.written = self.path
        logger.info("torch.profiler capture written to %s", self.path)


class CudaProfilerWindow(_Window):
    """cudaProfilerStart before step `start`, cudaProfilerStop after step `end - 1`.

    Args:
        window: (start, end) engine steps.
        profiler: a module with start() and stop() (torch.cuda.profiler).
        synchronize: waits for the device (so the window holds the steps' kernels whole).
    """

    def __init__(self, window: StepWindow, profiler, synchronize):
        super().__init__(window)
        self.profiler = profiler
        self.synchronize = synchronize

    def _open(self, step: int) -> None:
        self.synchronize()
        self.profiler.start()
        logger.info("cudaProfilerStart at step %d", step)

    def _close(self) -> None:
        self.synchronize()
        self.profiler.stop()
        logger.info("cudaProfilerStop after step %d", self.end - 1)
