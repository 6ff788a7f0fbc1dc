"""quest (query-aware, Quest ICML 2024): per block and KV head the element-wise min and max of
its keys are kept beside the pool (pagedllm.sparse.key_bounds); each decode step, each KV head
reads the sink and local blocks plus the blocks with the largest upper bound of q.k,
sum_d max(q_d min_d, q_d max_d), up to token_budget tokens (pagedllm.sparse.quest_select).
"""

from __future__ import annotations

import numpy as np

from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.strategy import Strategy, sink_and_local


class Quest(Strategy):
    name = "quest"
    query_aware = True

    def select(self, num_blocks: int, cfg: SparseAttentionConfig) -> np.ndarray:
        return sink_and_local(num_blocks, cfg.sink_blocks, cfg.local_blocks)

    def budget_blocks(self, num_blocks: int, block_size: int,
                      cfg: SparseAttentionConfig) -> int:
        return min(num_blocks, max(cfg.token_budget // block_size,
                                   cfg.sink_blocks + cfg.local_blocks))
