"""The scheduler's side of block-sparse attention: each request's effective config, the step's
plan (pagedllm.sparse.plan) and the read-vs-held counters behind kv_cache_stats() / /metrics.

Plain Python and numpy (no device): the Scheduler owns one and calls it while it packs a step.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.plan import SparsePlan, plan_step


class SparseScheduling:
    """Effective configs, per-step plans and their counters.

    Args:
        default: the engine's config (None: dense unless a request asks).
        block_size: tokens per block.
    """

    def __init__(self, default: Optional[SparseAttentionConfig], block_size: int):
        self.default = default
        self.block_size = block_size
        self.key_bounds = default is not None and default.strategy == "quest"
        self.blocks_read_last_step = 0
        self.blocks_held_last_step = 0
        self.blocks_read_total = 0
        self.blocks_held_total = 0
        self.force_plan = False  # plan (and run the sparse kernels) even when all blocks are read

    def config_for(self, params: Any) -> Optional[SparseAttentionConfig]:
        """A request's config: its SamplingParams.sparse_attention, else the engine default."""
        own = getattr(params, "sparse_attention", None)
        return own if own is not None else self.default

    def check_request(self, params: Any) -> None:
        """Raises ValueError for a request whose config this engine cannot serve.

        Raises:
            ValueError: quest asked per request while the pool keeps no key bounds, or a
                token_budget below the always-read blocks at this block size.
        """
        cfg = getattr(params, "sparse_attention", None)
        if cfg is None:
            return
        if cfg.strategy == "quest" and not self.key_bounds:
            raise ValueError(
                "SamplingParams.sparse_attention.strategy = 'quest' needs the per-block key "
                "bounds, which the pool keeps only when the engine's sparse_attention.strategy "
                "is 'quest'; start the engine with it or pick another strategy")
        try:
            cfg.check_block_size(self.block_size)
        except ValueError as e:
            raise ValueError(f"SamplingParams.{e}") from None

    def plan(self, params: Sequence[Any], context_lens: np.ndarray) -> Optional[SparsePlan]:
        """The plan of a step's decode sequences (records the read/held counters).

        Args:
            params: per decode sequence, its request's SamplingParams.
            context_lens: int32 [num_decode_seqs], context after the step.
        Returns:
            The plan, or None when every sequence reads all its blocks.
        """
        configs = [self.config_for(p) for p in params]
        plan = None
        if any(c is not None and c.enabled for c in configs):
            plan = plan_step(configs, context_lens, self.block_size, self.force_plan)
        held = int((-(-context_lens.astype(np.int64) // self.block_size)).sum())
        read = plan.blocks_read if plan is not None else held
        self.blocks_read_last_step, self.blocks_held_last_step = read, held
        self.blocks_read_total += read
        self.blocks_held_total += held
        return plan

    def stats(self) -> dict:
        """The counters: decode blocks read vs held, last step and in total (per KV head)."""
        total = self.blocks_held_total
        return {
            "sparse_blocks_read_last_step": self.blocks_read_last_step,
            "sparse_blocks_held_last_step": self.blocks_held_last_step,
            "sparse_blocks_read_total": self.blocks_read_total,
            "sparse_blocks_held_total": total,
            "sparse_read_fraction": self.blocks_read_total / total if total else 1.0,
        }
