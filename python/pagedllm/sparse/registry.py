"""The block-selection strategies by name. Every module of pagedllm.sparse.strategies that
defines a Strategy subclass with a `name` is registered when first asked for, so adding a
strategy is adding one file there.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Dict

from pagedllm.sparse.strategy import Strategy

_STRATEGIES: Dict[str, Strategy] = {}


def _load() -> Dict[str, Strategy]:
    if not _STRATEGIES:
        from pagedllm.sparse import strategies

        for info in pkgutil.iter_modules(strategies.__path__):
            module = importlib.import_module(f"{strategies.__name__}.{info.name}")
            for obj in vars(module).values():
                if (isinstance(obj, type) and issubclass(obj, Strategy) and obj is not Strategy
                        and obj.__module__ == module.__name__):
                    _STRATEGIES[obj.name] = obj()
    return _STRATEGIES


def strategy_names() -> list[str]:
    """The registered strategy names, sorted."""
    return sorted(_load())


def get_strategy(name: str) -> Strategy:
    """The strategy registered as `name`.

    Raises:
        ValueError: no such strategy.
    """
    table = _load()
    if name not in table:
        raise ValueError(f"unknown sparse attention strategy {name!r}; expected one of "
                         f"{sorted(table)}")
    return table[name]
