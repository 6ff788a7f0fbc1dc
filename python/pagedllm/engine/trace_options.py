"""TraceOptions: what a run asks to record (--profile-trace, --profile-layers,
--profile-torch-steps, --profile-cuda-steps; `LLM(profile_trace=...)`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple, Union

StepWindow = Tuple[int, int]  # engine steps [start, end), counted from 0


def parse_step_window(value: Union[str, StepWindow, None], option: str) -> Optional[StepWindow]:
    """A step window from 'START:END' (or a (start, end) pair): steps start .. end - 1.

    Raises:
        ValueError: not two integers with 0 <= START < END (the message names `option`).
    """
    if value is None:
        return None
    try:
        if isinstance(value, str):
            start_text, end_text = value.split(":")
            start, end = int(start_text), int(end_text)
        else:
            start, end = (int(v) for v in value)
    except (ValueError, TypeError):
        raise ValueError(f"{option}={value!r}: expected START:END, two step numbers "
                         f"(e.g. 10:20 for steps 10 to 19)") from None
    if not 0 <= start < end:
        raise ValueError(f"{option}={value!r}: expected 0 <= START < END")
    return start, end


@dataclass(frozen=True)
class TraceOptions:
    """What to record while the engine steps.

    Attributes:
        path: the Chrome/Perfetto trace JSON of every step's spans (None: no JSON).
        layers: a span per decoder layer inside `forward` (and an NVTX range on CUDA).
        torch_steps: steps [start, end) captured by torch.profiler into `torch_trace_path`.
        cuda_steps: steps [start, end) between cudaProfilerStart and cudaProfilerStop (for
            `nsys profile --capture-range=cudaProfilerApi`; CUDA only).
    Raises:
        ValueError: a bad window, or an option that needs another one (named).
    """

    path: Optional[str] = None
    layers: bool = False
    torch_steps: Optional[StepWindow] = None
    cuda_steps: Optional[StepWindow] = None

    def __post_init__(self):
        object.__setattr__(self, "torch_steps",
                           parse_step_window(self.torch_steps, "profile_torch_steps"))
        object.__setattr__(self, "cuda_steps",
                           parse_step_window(self.cuda_steps, "profile_cuda_steps"))
        if self.path is not None and not isinstance(self.path, (str, os.PathLike)):
            raise ValueError(f"profile_trace={self.path!r}: expected a file path")
        if self.path is not None:
            object.__setattr__(self, "path", os.fspath(self.path))
            if not self.path.strip():
                raise ValueError(f"profile_trace={self.path!r} is empty: expected a file path "
                                 f"(None: no trace)")
        if self.torch_steps is not None and self.path is None:
            raise ValueError("profile_torch_steps needs profile_trace (the torch.profiler "
                             "capture is written beside it, as <name>.torch.json)")
        if self.layers and self.path is None and self.cuda_steps is None:
            raise ValueError("profile_layers needs profile_trace (or profile_cuda_steps, for "
                             "NVTX ranges on CUDA)")

    @property
    def enabled(self) -> bool:
        """True when anything is recorded."""
        return self.path is not None or self.cuda_steps is not None

    @property
    def torch_trace_path(self) -> Optional[str]:
        """Where the torch.profiler window goes: the trace path with .torch.json."""
        if self.torch_steps is None or self.path is None:
            return None
        stem = self.path[:-5] if self.path.endswith(".json") else self.path
        return stem + ".torch.json"
