"""The Strategy interface: which logical blocks one sequence's decode query reads.

A strategy sees a sequence's number of used blocks and the config and returns its sorted
block ids (numpy int32). The caller (pagedllm.sparse.plan) adds the rules every strategy keeps:
block 0 and the current (last) block are always read, and below `min_context` tokens the
attention stays dense. Query-aware strategies (`query_aware`) return the blocks they always
read, and `budget_blocks` bounds the total the attention layer picks per KV head from the
query (pagedllm.sparse.quest_select).
"""

from __future__ import annotations

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig


def sink_and_local(num_blocks: int, sink: int, local: int) -> np.ndarray:
    """Blocks [0, sink) and [num_blocks - local, num_blocks), sorted, int32."""
    head = np.arange(min(sink, num_blocks))
    tail = np.arange(max(num_blocks - local, 0), num_blocks)
    return np.union1d(head, tail).astype(np.int32)


class Strategy:
    """Base class; subclasses set `name` and implement select()."""

    name = ""
    query_aware = False   # the attention layer refines the choice with the query (quest)
    frees_blocks = False  # blocks it never reads again are returned to the allocator

    def select(self, num_blocks: int, cfg: SparseAttentionConfig) -> np.ndarray:
        """Sorted logical block ids (int32) to read out of [0, num_blocks)."""
        raise NotImplementedError

    def budget_blocks(self, num_blocks: int, block_size: int,
                      cfg: SparseAttentionConfig) -> int:
        """Query-aware only: the blocks read per KV head (the forced ones included)."""
        return num_blocks
