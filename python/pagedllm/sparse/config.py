"""The `sparse_attention` option: parsing and validation, shared by YAML, the CLI, `LLM(...)`,
`SamplingParams(sparse_attention=...)` and the server's extra body field.

A config is a dict with the keys of SparseAttentionConfig; unknown keys, wrong types and bad
combinations raise ValueError naming the key, the value and what was expected.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional

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
        from pagedllm.sparse.registry import strategy_names  # the registry imports this module

        names = strategy_names()
        if not isinstance(self.strategy, str) or self.strategy not in (DENSE, *names):
            raise ValueError(f"sparse_attention.strategy: expected one of "
                             f"{[DENSE, *names]}, got {self.strategy!r}")
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


def parse_sparse_attention(value: Any, where: str = "sparse_attention",
                           base: Optional[SparseAttentionConfig] = None
                           ) -> Optional[SparseAttentionConfig]:
    """A SparseAttentionConfig from None, a config or a mapping of its keys.

    Args:
        value: None (no sparse attention / no override), a SparseAttentionConfig, or a dict
            with a subset of KEYS (missing keys come from `base`, else the defaults).
        where: the option's name for error messages (e.g. "SamplingParams.sparse_attention").
        base: the config whose values fill missing keys (an engine default under a request's).
    Returns:
        The config, or None for None.
    Raises:
        ValueError: not a mapping, an unknown key, or a bad value (naming `where` and the key).
    """
    if value is None or isinstance(value, SparseAttentionConfig):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping with keys {list(KEYS)}, got "
                         f"{type(value).__name__}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected a subset of {list(KEYS)}")
    merged = (base.to_dict() if base is not None else {}) | dict(value)
    if "strategy" not in merged:
        raise ValueError(f"{where}: 'strategy' is required (one of the registered strategies "
                         f"or 'dense')")
    try:
        return SparseAttentionConfig(**merged)
    except ValueError as e:  # "sparse_attention.<key>: ..." -> "<where>.<key>: ..."
        raise ValueError(where + str(e).removeprefix("sparse_attention")) from None
