"""PersistenceConfig: the `persistence:` section of the engine config (the persistent KV tier).

    persistence:
      enabled: true
      storage_path: /nvme/cache     # a directory the engine owns (locked while it runs)
      backend: file                 # file | rocksdb (when compiled in: pagedllm info)
      max_bytes: 64GiB              # size cap; least recently used records go past it (0: none)
      hot_blocks_threshold: 0       # see below

`hot_blocks_threshold` decides when a full prompt block is written: 0 writes every full
prompt block in the step that computes it (the store then holds everything a restart could
reuse); N >= 1 writes a block once the in-memory prefix cache has served it to N requests
(only blocks that proved popular reach the disk). The seed's 1000 suits a fleet where disk
space and write bandwidth are scarce and only the hottest system prompts matter; for one
engine whose point is to survive restarts with its long documents, 0 (or a small N) is the
useful default: a block served 1000 times is, almost by definition, already in memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

BACKENDS = ("file", "rocksdb")
_KEYS = ("enabled", "storage_path", "backend", "max_bytes", "hot_blocks_threshold")


@dataclass(frozen=True)
class PersistenceConfig:
    """Options of the persistent KV tier.

    Args:
        enabled: use the tier.
        storage_path: the store's directory (created if missing).
        backend: "file" (default, no dependency) or "rocksdb".
        max_bytes: the store's size cap in bytes (0: unlimited).
        hot_blocks_threshold: 0 = write every full prompt block when computed; N = write a
            block once the prefix cache has served it to N requests.
    Raises:
        ValueError: a bad value, named.
    """

    enabled: bool = False
    storage_path: Optional[str] = None
    backend: str = "file"
    max_bytes: int = 0
    hot_blocks_threshold: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"persistence.enabled must be true or false, got {self.enabled!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"persistence.backend must be one of {', '.join(BACKENDS)}, "
                             f"got {self.backend!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) \
                or self.max_bytes < 0:
            raise ValueError(f"persistence.max_bytes must be an integer >= 0 (bytes; 0 = no "
                             f"cap), got {self.max_bytes!r}")
        if (isinstance(self.hot_blocks_threshold, bool)
                or not isinstance(self.hot_blocks_threshold, int)
                or not 0 <= self.hot_blocks_threshold <= 1_000_000):
            raise ValueError(f"persistence.hot_blocks_threshold must be an integer in "
                             f"[0, 1000000], got {self.hot_blocks_threshold!r}")
        if self.enabled:
            if not isinstance(self.storage_path, str) or not self.storage_path:
                raise ValueError("persistence.storage_path must be a directory path when "
                                 "persistence is enabled")
            parent = os.path.dirname(os.path.abspath(self.storage_path))
            if os.path.exists(self.storage_path) and not os.path.isdir(self.storage_path):
                raise ValueError(f"persistence.storage_path {self.storage_path!r} exists and "
                                 f"is not a directory")
            if os.path.exists(parent) and not os.path.isdir(parent):
                raise ValueError(f"persistence.storage_path {self.storage_path!r}: its parent "
                                 f"{parent!r} is not a directory")
            if not os.path.isdir(parent):
                raise ValueError(f"persistence.storage_path {self.storage_path!r}: its parent "
                                 f"directory {parent!r} does not exist")

    @classmethod
    def from_value(cls, value: Any) -> Optional["PersistenceConfig"]:
        """A PersistenceConfig from a mapping (YAML section, LLM(persistence={...})), an
        instance, or None.

        Raises:
            ValueError: not a mapping, or an unknown key (named).
        """
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"persistence must be a mapping of {', '.join(_KEYS)}, got {value!r}")
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise ValueError(f"unknown key 'persistence.{unknown[0]}' in config (known: "
                             f"{', '.join(_KEYS)})")
        fields: Dict[str, Any] = dict(value)
        if "storage_path" in fields and "enabled" not in fields:
            fields["enabled"] = True  # giving a path turns it on
        return cls(**fields)
