"""Keeps freed host memory in the process, so a CPU step's tensors are not page-faulted anew.

Every step allocates its activations afresh (the projections' outputs, the MLP's gate_up and
its product, attention's output), megabytes each at prefill sizes. glibc's malloc serves a block
over its mmap threshold (128 KiB to start, raised as such blocks are freed) with a fresh
mapping and returns it to the system when freed, and trims the heap's top above its trim
threshold: either way the next step's tensor lands on pages the kernel must fault in and zero
again. On the development machine (2-core AMD EPYC) a "tiny" long-prompt run took 50-100k minor
page faults per 16 requests and 3-6% of its CPU time in the kernel; with the memory kept, none
(docs/BENCHMARKS.md, "Freed memory kept in the process").

keep_freed_memory() sets both thresholds once for the process (mallopt: mmap threshold 32 MiB,
glibc's largest, and trim threshold 1 GiB), as vLLM's CPU guide gets from TCMalloc. Blocks over
32 MiB are still mapped and unmapped per use. The cost: the process keeps the high-water mark of
its step memory instead of returning it between steps. Set PAGEDLLM_KEEP_FREED_MEMORY=0 to
leave malloc as it is; on a C library other than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

ENV = "PAGEDLLM_KEEP_FREED_MEMORY"  # "0": leave malloc's thresholds alone
M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the largest it takes
TRIM_THRESHOLD = 1 << 30

_applied = None  # the first call's result; later calls return it


def keep_freed_memory() -> bool:
    """Raises glibc malloc's mmap and trim thresholds for this process (once).

    Returns:
        True when the thresholds are set (now or by an earlier call); False when turned off by
        PAGEDLLM_KEEP_FREED_MEMORY=0, the C library is not glibc, or mallopt refused.
    """
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get(ENV, "1").strip() == "0":
        _applied = False
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _applied = False
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        _applied = False
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
          and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    if not ok:
        logger.warning("mallopt refused the mmap / trim thresholds: step tensors stay "
                       "page-faulted per step")
    _applied = ok
    return ok
