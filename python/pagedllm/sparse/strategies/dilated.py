"""dilated: every `stride`-th block (0, stride, 2 stride, ...) plus the sink and local blocks."""

from __future__ import annotations

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.strategy import Strategy, sink_and_local


class Dilated(Strategy):
    name = "dilated"

    def select(self, num_blocks: int, cfg: SparseAttentionConfig) -> np.ndarray:
        strided = np.arange(0, num_blocks, cfg.stride)
        return np.union1d(strided, sink_and_local(num_blocks, cfg.sink_blocks,
                                                  cfg.local_blocks)).astype(np.int32)
