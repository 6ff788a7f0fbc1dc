"""random: a seeded random subset of the middle blocks at `density`, plus sink and local blocks.

The draw depends only on (seed, num_blocks): the same sequence length always reads the same
blocks, and a new block re-draws (numpy's PCG64 seeded with [seed, num_blocks]).
"""

from __future__ import annotations

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.strategy import Strategy, sink_and_local


class RandomBlocks(Strategy):
    name = "random"

    def select(self, num_blocks: int, cfg: SparseAttentionConfig) -> np.ndarray:
        fixed = sink_and_local(num_blocks, cfg.sink_blocks, cfg.local_blocks)
        middle = np.setdiff1d(np.arange(num_blocks), fixed)
        count = int(round(cfg.density * len(middle)))
        rng = np.random.default_rng([cfg.seed, num_blocks])
        drawn = rng.choice(middle, size=count, replace=False) if count else middle[:0]
        return np.union1d(fixed, drawn).astype(np.int32)
