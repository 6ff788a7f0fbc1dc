"""streaming (StreamingLLM, ICLR 2024): the sink blocks plus a window of `local_blocks`; blocks
that fall out of the window are never read again, so they are returned to the allocator
(pagedllm.sparse.streaming_evict; a block shared with another sequence stays theirs).
"""

from __future__ import annotations

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.strategy import Strategy, sink_and_local


class Streaming(Strategy):
    name = "streaming"
    frees_blocks = True

    def select(self, num_blocks: int, cfg: SparseAttentionConfig) -> np.ndarray:
        return sink_and_local(num_blocks, cfg.sink_blocks, cfg.local_blocks)
