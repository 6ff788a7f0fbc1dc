"""parse_sparse_attention: the `sparse_attention` option from YAML, the CLI, `LLM(...)`,
`SamplingParams(sparse_attention=...)` and the server's extra body field.

A config is a dict with the keys of SparseAttentionConfig; unknown keys, an unregistered
strategy, wrong types and bad combinations raise ValueError naming the key, the value and what
was expected.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from pagedllm.sparse.config import DENSE, KEYS, SparseAttentionConfig
from pagedllm.sparse.registry import strategy_names


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
    names = strategy_names()
    if merged["strategy"] not in (DENSE, *names):
        raise ValueError(f"{where}.strategy: expected one of {[DENSE, *names]}, got "
                         f"{merged['strategy']!r}")
    try:
        return SparseAttentionConfig(**merged)
    except ValueError as e:  # "sparse_attention.<key>: ..." -> "<where>.<key>: ..."
        raise ValueError(where + str(e).removeprefix("sparse_attention")) from None
