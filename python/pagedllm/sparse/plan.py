"""A step's block-sparse plan: per decode sequence, the logical blocks its query reads.

Built on the scheduler side from plain arrays (numpy; no device), carried in the
SchedulerOutput, turned into kernel inputs by the worker (pagedllm.sparse.attend). Prefill rows
(prompts, chunks) stay dense. Rules every strategy keeps: block 0 and the current (last) block
are read, and a context below `min_context` tokens (or a config of strategy "dense") reads
every block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.registry import get_strategy


@dataclass
class SparsePlan:
    """The decode sequences' block lists of one step.

    Attributes:
        indptr: int32 [num_decode_seqs + 1], CSR offsets into indices (one list per sequence).
        indices: int32 [indptr[-1]], each sequence's logical blocks, increasing (query-aware
            sequences: the blocks they always read).
        budget: int32 [num_decode_seqs], query-aware sequences: blocks each KV head reads in
            total (the listed ones included); 0: the list is final.
        num_blocks: int32 [num_decode_seqs], each sequence's used blocks.
        blocks_read: blocks the step's decode attention reads (per KV head, summed over the
            sequences).
        blocks_held: blocks those sequences hold (their used blocks).
    """

    indptr: np.ndarray
    indices: np.ndarray
    budget: np.ndarray
    num_blocks: np.ndarray
    blocks_read: int
    blocks_held: int

    @property
    def query_aware(self) -> bool:
        """Whether the attention layer picks blocks from the query (per KV head)."""
        return bool(self.budget.any())


def select_blocks(cfg: Optional[SparseAttentionConfig], context_len: int,
                  block_size: int) -> tuple[np.ndarray, int]:
    """(sorted logical blocks, query-aware budget or 0) of one decode sequence.

    Args:
        cfg: the sequence's sparse config (None or "dense": every block).
        context_len: tokens of context, the new one included.
        block_size: tokens per block.
    """
    num_blocks = -(-context_len // block_size)
    every = np.arange(num_blocks, dtype=np.int32)
    if cfg is None or not cfg.enabled or context_len < cfg.min_context or num_blocks <= 2:
        return every, 0
    strategy = get_strategy(cfg.strategy)
    chosen = strategy.select(num_blocks, cfg)
    chosen = np.union1d(chosen, [0, num_blocks - 1]).astype(np.int32)
    if strategy.query_aware:
        budget = strategy.budget_blocks(num_blocks, block_size, cfg)
        if budget >= num_blocks:
            return every, 0
        return chosen, max(budget, len(chosen))
    return chosen, 0


def plan_step(configs: Sequence[Optional[SparseAttentionConfig]], context_lens: np.ndarray,
              block_size: int, always: bool = False) -> Optional[SparsePlan]:
    """The plan of a step's decode sequences, or None when every one reads all its blocks.

    Args:
        configs: per decode sequence, its effective config (request override or engine default).
        context_lens: int32 [num_decode_seqs], context after the step.
        block_size: tokens per block.
        always: return the plan even when it lists every block (the sparse kernels then run
            the dense case: for tests and benchmarks).
    """
    lists, budgets = [], []
    sparse = False
    held = 0
    for cfg, n in zip(configs, context_lens.tolist()):
        blocks, budget = select_blocks(cfg, int(n), block_size)
        used = -(-int(n) // block_size)
        held += used
        sparse |= budget > 0 or len(blocks) < used
        lists.append(blocks)
        budgets.append(budget)
    if not sparse and not always:
        return None
    indptr = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in lists], out=indptr[1:])
    indices = np.concatenate(lists).astype(np.int32) if lists else np.zeros(0, np.int32)
    read = sum(b if b else len(blocks) for b, blocks in zip(budgets, lists))
    used = -(-context_lens.astype(np.int64) // block_size)
    return SparsePlan(indptr, indices, np.asarray(budgets, dtype=np.int32),
                      used.astype(np.int32), read, held)
