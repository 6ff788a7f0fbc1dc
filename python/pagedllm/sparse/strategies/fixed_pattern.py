"""fixed_pattern: the first `sink_blocks` blocks plus the last `local_blocks` blocks."""

from __future__ import annotations

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.strategy import Strategy, sink_and_local


class FixedPattern(Strategy):
    name = "fixed_pattern"

    def select(self, num_blocks: int, cfg: SparseAttentionConfig) -> np.ndarray:
        return sink_and_local(num_blocks, cfg.sink_blocks, cfg.local_blocks)
