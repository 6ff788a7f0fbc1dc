"""Timeline traces of engine steps: a torch.profiler capture (CPU activities) written as a
Chrome trace JSON (open it in https://ui.perfetto.dev or chrome://tracing).

``LLMEngine.start_trace(path)`` arms a StepTracer; the profiler starts on the thread that runs
the next step (Kineto wants start and stop on one thread: the server's engine thread, or the
caller of ``step()`` offline), and every step is annotated with
``torch.profiler.record_function`` spans: ``pagedllm.step`` around ``pagedllm.schedule``,
``pagedllm.execute`` (transfers + forward, with torch's op events inside), ``pagedllm.sample``
and ``pagedllm.update``. ``LLMEngine.stop_trace()`` (same thread) stops it and writes the file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Optional

logger = logging.getLogger("pagedllm")

STEP_SPANS = ("pagedllm.schedule", "pagedllm.execute", "pagedllm.sample", "pagedllm.update")


def no_span(name: str):
    """The span of an untraced step: nothing."""
    return contextlib.nullcontext()


class StepTracer:
    """One capture window, from the first traced step to stop().

    Args:
        path: the Chrome trace JSON to write.
    Raises:
        ValueError: the path's directory does not exist.
    """

    def __init__(self, path: str):
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise ValueError(f"trace file {path!r}: directory {directory!r} does not exist")
        self.path = path
        self._prof = None
        self.num_steps = 0

    def ensure_started(self) -> None:
        """Starts the profiler (on the calling thread) unless it runs."""
        if self._prof is None:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU])
            self._prof.__enter__()

    def stop(self) -> Optional[str]:
        """Stops the profiler and writes the trace; the path, or None if no step was traced."""
        if self._prof is None:
            return None
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(self.path)
        logger.info("trace of %d steps written to %s", self.num_steps, self.path)
        return self.path
