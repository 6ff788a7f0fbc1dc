"""How many CPU threads torch and the kernels use, and which threads the kernels run on.

The CPU kernels (`pagedllm._core`: attention, the fused row ops) and torch's matmuls (oneDNN)
alternate many times per decode step. On two separate thread pools they fight over the cores:
torch's OpenMP threads spin for a while after each matmul while the kernels' pool wants the same
cores, and on a 2-core machine a decode step's attention ran 3-4x slower than alone. So by
default the kernels run on torch's own OpenMP team (`_core.adopt_loaded_openmp`: the runtime
torch has loaded, found by name, neither linked nor loaded by pagedllm). Set the environment
variable PAGEDLLM_THREAD_RUNTIME=builtin to keep them on pagedllm's built-in pool.
"""

from __future__ import annotations

import os
from typing import Optional

import torch  # loads torch's OpenMP runtime before the kernels look for it

from pagedllm import _core

RUNTIME_ENV = "PAGEDLLM_THREAD_RUNTIME"
RUNTIMES = ("openmp", "builtin")


def share_torch_threads() -> str:
    """Runs the kernels on torch's OpenMP team unless PAGEDLLM_THREAD_RUNTIME=builtin.

    Returns:
        Where the kernels run now: "openmp:<library>" or "builtin" (also when torch has no
        OpenMP runtime loaded).
    Raises:
        ValueError: PAGEDLLM_THREAD_RUNTIME is set to something other than openmp or builtin.
    """
    choice = os.environ.get(RUNTIME_ENV, "openmp").strip().lower() or "openmp"
    if choice not in RUNTIMES:
        raise ValueError(f"{RUNTIME_ENV}={os.environ[RUNTIME_ENV]!r}: expected one of {RUNTIMES}")
    if choice == "builtin":
        _core.use_builtin_pool()
    else:
        _core.adopt_loaded_openmp()
    return _core.parallel_runtime()


def set_num_threads(num_threads: Optional[int]) -> int:
    """Sets torch's and the kernels' thread count, the kernels on torch's team (see above).

    Args:
        num_threads: the count, or None for every CPU this process may run on.
    Returns:
        The count set.
    """
    threads = num_threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    _core.set_num_threads(threads)
    share_torch_threads()
    return threads
