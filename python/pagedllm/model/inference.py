"""`inference`: torch.inference_mode around a function, entered only when it is not already on.

A step nests several inference-mode functions (the runner's execute, the model's forward and
compute_logits, the sampler); torch's decorator builds and enters a context manager at each
level (about 1.5 us each). Inside an outer inference_mode the inner levels change nothing, so
this one checks the thread's mode first and calls straight through when it is on.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)


def inference(fn: F) -> F:
    """Decorates `fn` to run under torch.inference_mode (a no-op when the mode is on).

    Args:
        fn: the function.
    Returns:
        The wrapped function.
    """
    enabled = torch.is_inference_mode_enabled

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
