"""The scheduler's side of block-sparse attention: each request's effective config, the step's
plan (pagedllm.sparse.plan) and the read-vs-held counters behind kv_cache_stats() / /metrics.

Plain Python and numpy (no device): the Scheduler owns one and calls it while it packs a step.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.plan import SparsePlan, plan_step, select_blocks
from pagedllm.sparse.registry import get_strategy


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
        self.blocks_dropped_total = 0  # > 0 once any table has a dropped (-1) block
        self.force_plan = False  # plan (and run the sparse kernels) even when all blocks are read
        # live requests with a config of their own (the scheduler tracks / forgets them): with
        # none and no default, every step is dense and nothing is asked per sequence
        self._own: set = set()

    def config_for(self, params: Any) -> Optional[SparseAttentionConfig]:
        """A request's config: its SamplingParams.sparse_attention, else the engine default;
        None params (a prompt row: prompts are attended densely) give None."""
        if params is None:
            return None
        own = getattr(params, "sparse_attention", None)
        return own if own is not None else self.default

    def track(self, request_id: str, params: Any) -> None:
        """Notes a new request (its own config, if it has one, makes steps ask per row)."""
        if getattr(params, "sparse_attention", None) is not None:
            self._own.add(request_id)

    def forget(self, request_id: str) -> None:
        """Notes that a request left the engine."""
        self._own.discard(request_id)

    @property
    def maybe_sparse(self) -> bool:
        """False when no step can attend sparsely: no default, no live request's own config."""
        return self.default is not None or bool(self._own)

    def any_sparse(self, params: Sequence[Any]) -> bool:
        """Whether any of these decode rows' requests (None: a prompt row) may attend
        sparsely: an engine default, or a request's own config."""
        if not self.maybe_sparse:
            return False
        if self.default is not None:
            return any(p is not None for p in params)
        return any(getattr(p, "sparse_attention", None) is not None for p in params)

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

    def evict(self, kv: Any, seq_ids: np.ndarray, params: Sequence[Any],
              context_lens: np.ndarray) -> int:
        """Streaming: drops the blocks that fell out of each decode sequence's window (between
        the sink blocks and the last local_blocks) from its table; a block goes back to the
        allocator once no other table (a fork, a prefix-cache hit) holds it.

        Args:
            kv: the KVCacheManager.
            seq_ids: int64 [num_decode_seqs]; params: their requests' SamplingParams (None:
                a prompt row, nothing dropped).
            context_lens: int32 [num_decode_seqs], context after the step.
        Returns:
            Blocks dropped from the tables.
        """
        if not self.any_sparse(params):
            return 0
        dropped = 0
        for seq_id, p, n in zip(seq_ids.tolist(), params, context_lens.tolist()):
            cfg = self.config_for(p)
            if cfg is None or not cfg.enabled or n < cfg.min_context:
                continue
            if not get_strategy(cfg.strategy).frees_blocks:
                continue
            used = -(-n // self.block_size)
            end = used - cfg.local_blocks
            if used > 2 and end > cfg.sink_blocks:
                dropped += kv.drop_blocks(seq_id, cfg.sink_blocks, end)
        self.blocks_dropped_total += dropped
        return dropped

    def blocks_needed(self, params: Any, prompt_len: int, total_len: int) -> int:
        """Blocks a request needs at its longest: every block of total_len tokens, or under
        streaming its prompt's (prefilled densely) or the sink + window + the block being
        filled, whichever is more."""
        every = -(-total_len // self.block_size)
        cfg = self.config_for(params)
        if cfg is None or not cfg.enabled or not get_strategy(cfg.strategy).frees_blocks:
            return every
        window = cfg.sink_blocks + cfg.local_blocks + 1
        return min(every, max(-(-prompt_len // self.block_size) + 1, window))

    def reads_fewer(self, params: Any, context_len: int) -> bool:
        """Whether a decode step at `context_len` tokens (the new one included) reads fewer
        blocks than the sequence holds: its attention, and so the K/V written from the next
        layer's input on, are then approximate, and other requests must not reuse them.

        Args:
            params: the request's SamplingParams.
            context_len: the sequence's context after the step.
        """
        cfg = self.config_for(params)
        if cfg is None or not cfg.enabled or context_len < cfg.min_context:
            return False
        chosen, budget = select_blocks(cfg, context_len, self.block_size)
        return budget > 0 or len(chosen) < -(-context_len // self.block_size)

    @staticmethod
    def dropped_any(kv: Any, seq_id: int) -> bool:
        """Whether the sequence's table has dropped blocks (it cannot be swapped out whole)."""
        return bool((kv.block_table(seq_id) < 0).any())

    def plan(self, params: Sequence[Any], context_lens: np.ndarray,
             tables: np.ndarray) -> Optional[SparsePlan]:
        """The plan of a step's decode sequences (records the read/held counters).

        Args:
            params: per decode sequence, its request's SamplingParams (None: a prompt row,
                dense).
            context_lens: int32 [num_decode_seqs], context after the step.
            tables: int32 [num_decode_seqs, W] their block tables (-1: a dropped block).
        Returns:
            The plan, or None when every sequence reads all its blocks.
        """
        plan = None
        if self.any_sparse(params):
            configs = [self.config_for(p) for p in params]
            if any(c is not None and c.enabled for c in configs):
                plan = plan_step(configs, context_lens, self.block_size, self.force_plan)
        used = (context_lens.astype(np.int64) + (self.block_size - 1)) // self.block_size
        if self.blocks_dropped_total == 0:  # no table has a dropped block: each holds `used`
            held = int(used.sum())
        else:
            cols = np.arange(tables.shape[1] if tables.ndim == 2 else 0)
            held = int(((tables >= 0) & (cols[None, :] < used[:, None])).sum()) if len(used) else 0
        read = plan.blocks_read if plan is not None else held
        if plan is not None:
            plan.blocks_held = held
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
            "sparse_blocks_dropped": self.blocks_dropped_total,
        }
