"""KVTransferPlan: the block moves one step needs, decided by the scheduler, run by the worker.

Everything is block ids (numpy int64 [k, 2] pairs), never tensors. The worker runs the plan in
this order, so that one step may free a victim's blocks and hand them to another sequence:

    before the forward:  swap_out (device -> host), swap_in (host -> device), loads
                         (persistent tier -> device), copies (copy-on-write, device -> device)
    after the forward:   stores (device -> persistent tier)

A block is never both swapped out and swapped in within one step (the scheduler resumes
swapped sequences only in steps that preempted nothing). Loads and stores are the persistent
tier's lists; that tier fills them (nothing does yet: they stay empty).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np


def no_pairs() -> np.ndarray:
    """An empty [0, 2] int64 pair list."""
    return np.zeros((0, 2), dtype=np.int64)


def as_pairs(pairs) -> np.ndarray:
    """(src, dst) pairs as a contiguous int64 [k, 2] array."""
    if isinstance(pairs, list) and not pairs:  # most steps move nothing
        return no_pairs()
    arr = np.asarray(pairs, dtype=np.int64)
    return arr.reshape(-1, 2) if arr.size else no_pairs()


@dataclass
class KVTransferPlan:
    """One step's block moves.

    Attributes:
        swap_out: int64 [k, 2] (device block, host block): victims preempted by swapping.
        swap_in: int64 [k, 2] (host block, device block): swapped sequences resumed.
        copies: int64 [k, 2] (src, dst) device blocks: copy-on-write of shared partial blocks.
        loads: (key, device block) from the persistent tier, before the forward.
        stores: (device block, key) to the persistent tier, after the forward.
    """

    swap_out: np.ndarray = field(default_factory=no_pairs)
    swap_in: np.ndarray = field(default_factory=no_pairs)
    copies: np.ndarray = field(default_factory=no_pairs)
    loads: List[Tuple[bytes, int]] = field(default_factory=list)
    stores: List[Tuple[int, bytes]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        """True when the step moves no block."""
        return not (len(self.swap_out) or len(self.swap_in) or len(self.copies)
                    or self.loads or self.stores)

    @property
    def has_pre_forward(self) -> bool:
        """True when something must run before the forward."""
        return bool(len(self.swap_out) or len(self.swap_in) or len(self.copies) or self.loads)


def copy_waves(pairs: np.ndarray) -> List[np.ndarray]:
    """Splits ordered (src, dst) copies into batches that the kernels may run in parallel.

    One step can free a block that an earlier copy reads and hand it out as a later copy's
    destination (a preempted sharer), or hand the same block out twice; the kernels need
    distinct destinations that are never sources. Each wave keeps that, and waves run in order,
    so the result equals running the pairs one by one.

    Args:
        pairs: int64 [k, 2] in the order the scheduler produced them.
    Returns:
        Consecutive slices of `pairs` (one when nothing conflicts).
    """
    waves, start = [], 0
    srcs: set = set()
    dsts: set = set()
    for i, (src, dst) in enumerate(pairs.tolist()):
        if src in dsts or dst in srcs or dst in dsts:
            waves.append(pairs[start:i])
            start, srcs, dsts = i, set(), set()
        srcs.add(src)
        dsts.add(dst)
    waves.append(pairs[start:])
    return [w for w in waves if len(w)]
