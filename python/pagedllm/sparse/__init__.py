"""Block-sparse attention over the block table: configuration, strategies, per-step plans.

See docs/ARCHITECTURE.md ("Block-sparse attention") and docs/USAGE.md (`sparse_attention`).
"""

from pagedllm.sparse.config import DENSE, KEYS, SparseAttentionConfig
from pagedllm.sparse.options import parse_sparse_attention
from pagedllm.sparse.registry import get_strategy, strategy_names

__all__ = ["DENSE", "KEYS", "SparseAttentionConfig", "parse_sparse_attention", "get_strategy",
           "strategy_names"]
