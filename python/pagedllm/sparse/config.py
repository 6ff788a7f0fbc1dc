"""The `sparse_attention` option's values: SparseAttentionConfig and its checks (parsed from a
dict by sparse/options.py, which also checks the strategy name against the registry).

Wrong types and bad combinations raise ValueError naming the key, the value and what was
expected.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, fields
from typing import Any

DENSE = "dense"  # the strategy name that turns sparse attention off (e.g. per request)


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class SparseAttentionConfig:
    """Which blocks decode attention reads (see pagedllm.sparse.strategies).

    Args:
        strategy: a registered strategy name ("fixed_pattern", "dilated", "random", "quest",
            "streaming") or "dense".
        sink_blocks: leading blocks always attended (attention sinks); >= 1 (block 0 is
            always kept).
        local_blocks: trailing blocks always attended (the current block included); >= 1.
        stride: dilated: every stride-th block is attended; >= 1.
        density: random: the fraction of the middle blocks drawn, in (0, 1].
        token_budget: quest: tokens (whole blocks) read per KV head per step; >= 1.
        min_context: below this many context tokens attention stays dense; >= 0.
        seed: random: the seed of the draws; an integer >= 0.
    """

    strategy: str = DENSE
    sink_blocks: int = 1
    local_blocks: int = 4
    stride: int = 8
    density: float = 0.125
    token_budget: int = 2048
    min_context: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        # The strategy's name is checked against the registry by parse_sparse_attention
        # (sparse/options.py, above the registry); an unregistered one fails at get_strategy.
        if not isinstance(self.strategy, str):
            raise ValueError(f"sparse_attention.strategy: expected a strategy name, got "
                             f"{self.strategy!r}")
        for name, lo in (("sink_blocks", 1), ("local_blocks", 1), ("stride", 1),
                         ("token_budget", 1), ("min_context", 0), ("seed", 0)):
            v = getattr(self, name)
            if not _is_int(v) or v < lo:
                raise ValueError(f"sparse_attention.{name}: expected an integer >= {lo}, "
                                 f"got {v!r}")
        d = self.density
        if (not isinstance(d, numbers.Real) or isinstance(d, bool) or not 0.0 < float(d) <= 1.0):
            raise ValueError(f"sparse_attention.density: expected a number in (0, 1], got {d!r}")

    @property
    def enabled(self) -> bool:
        """Whether any block may be skipped."""
        return self.strategy != DENSE

    def check_block_size(self, block_size: int) -> None:
        """Raises ValueError when token_budget cannot hold the always-kept blocks."""
        if self.strategy == "quest":
            need = (self.sink_blocks + self.local_blocks) * block_size
            if self.token_budget < need:
                raise ValueError(
                    f"sparse_attention.token_budget = {self.token_budget} is below the "
                    f"{self.sink_blocks} sink + {self.local_blocks} local blocks it always "
                    f"reads ({need} tokens at block_size {block_size}): raise token_budget or "
                    f"lower sink_blocks / local_blocks")

    def to_dict(self) -> dict:
        """The config as a plain dict (the keys parse_sparse_attention takes)."""
        return asdict(self)


KEYS = tuple(f.name for f in fields(SparseAttentionConfig))
