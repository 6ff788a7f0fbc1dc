"""Zeroed CPU tensors on transparent huge pages (Linux), for the KV pool.

Decode attention reads each (block, layer, KV head) of the pool as one run of
block_size x head_dim elements: 4 KiB for bf16 at block 16 and head_dim 128, so on 4 KiB pages
every run is a different page and nearly every run a TLB miss (the pool is far larger than the
TLBs' reach). On 2 MiB pages the same reads go faster: measured on a 2-core AMD EPYC with both
in one process (benchmarks/huge_pages_ab.py; docs/BENCHMARKS.md, "Huge pages for the KV
pool"), the decode kernel at 16 x 2k and 1 x 8k tokens took 1.07-1.17x less time (bf16
16 x 2k: 23.0 -> 26.7 GB/s).

Opt-in, with PAGEDLLM_HUGE_PAGES=1: the memory is then an anonymous private mapping with
`madvise(MADV_HUGEPAGE)`, used when the system's THP setting is "always" or "madvise" (the
common default); otherwise, with "never" or on another OS, this is plain `torch.zeros`. Every
page is touched once here, so the pool is resident before the first step, as with torch.zeros.
Not the default because the engine's steps gain little (most of a step is GEMMs: 0.97-1.02x end
to end, within noise) while getting 2 GiB of huge pages took 1.3-1.9 s more at startup than
torch.zeros on the development machine (the kernel compacting memory for them).
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20  # bytes; x86-64's PMD-sized transparent huge page
SMALL_PAGE = 4096    # where a huge page could not be had, the kernel falls back to these
# Below this size a tensor gets no huge pages (a few pages of TLB reach matter little).
MIN_HUGE_BYTES = 8 * HUGE_PAGE
ENV = "PAGEDLLM_HUGE_PAGES"  # "1": the KV pool on huge pages (opt-in, see the module docstring)
_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str:
    """The system's transparent-huge-page mode ("always", "madvise", "never"), or "absent"
    where the kernel has none (or this is not Linux)."""
    try:
        text = _THP_SETTING.read_text()
    except OSError:
        return "absent"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "absent"


def available() -> bool:
    """True when this system honours madvise(MADV_HUGEPAGE) (Linux, THP "always"/"madvise")."""
    return hasattr(mmap, "MADV_HUGEPAGE") and thp_mode() in ("always", "madvise")


def enabled() -> bool:
    """True when zeros() places tensors on huge pages: PAGEDLLM_HUGE_PAGES=1 and available()."""
    return os.environ.get(ENV, "0").strip() == "1" and available()


def zeros(shape: Sequence[int], dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """A zeroed contiguous tensor, on 2 MiB pages when it is a large CPU tensor and enabled().

    Args:
        shape: the tensor's shape.
        dtype: its dtype.
        device: where it lives; anything but the CPU gets plain torch.zeros.
    Returns:
        The tensor. Its memory is an mmap that the tensor keeps alive and that is unmapped
        when the last view of it is freed.
    """
    device = torch.device(device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < MIN_HUGE_BYTES or not enabled():
        return torch.zeros(tuple(shape), dtype=dtype, device=device)
    # One huge page more than needed, so the tensor can start on a 2 MiB boundary.
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE
    mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mem.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # refused (an old kernel): the mapping still works on small pages
        pass
    raw = torch.frombuffer(mem, dtype=torch.uint8)  # keeps `mem` alive
    offset = -raw.data_ptr() % HUGE_PAGE
    out = raw[offset:offset + nbytes]
    # Fault every page in now, as torch.zeros would: left to the first write of each block,
    # the zeroing of a 2 MiB page lands inside a model step (a 64-token KV write measured
    # 4x slower while the pool was being faulted in), and memory that is not there shows up
    # as an out-of-memory kill mid-serve instead of here.
    out[::SMALL_PAGE].zero_()
    return out.view(dtype).view(tuple(shape))
