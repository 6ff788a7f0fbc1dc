"""config.json of a vision-language checkpoint (LLaVA, Mllama): the architecture peek and the
validated read, shared by llava_config.py and mllama_config.py.

Both keep the decoder's settings under `text_config`; generation_config.json, when present, is
checked against that decoder's vocabulary before the composite config is built.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional, TypeVar

from pagedllm.model.errors import CheckpointError
from pagedllm.model.files import read_json
from pagedllm.model.generation_config import GENERATION_CONFIG, check_generation_config

C = TypeVar("C")


def names_architecture(path: str | os.PathLike, architectures: tuple[str, ...],
                       model_type: str) -> bool:
    """True when `path`/config.json lists one of `architectures` or has `model_type` (a cheap
    peek, no validation; False without a config.json)."""
    cfg = os.path.join(os.fspath(path), "config.json")
    if not os.path.isfile(cfg):
        return False
    d = read_json(cfg)
    archs = d.get("architectures") or []
    return (isinstance(archs, list) and any(a in architectures for a in archs)) or \
        d.get("model_type") == model_type


def read_composite_config(path: str | os.PathLike,
                          from_dict: Callable[[Mapping[str, Any], Optional[dict]], C]) -> C:
    """config.json (+ generation_config.json) of a directory, parsed by `from_dict`.

    Args:
        path: the checkpoint directory.
        from_dict: (config.json dict, generation_config dict or None) -> the config; raises
            ValueError / TypeError on an invalid field.
    Returns:
        What from_dict returns.
    Raises:
        CheckpointError: a missing, unreadable or invalid file (named).
    """
    path = os.fspath(path)
    cfg_path = os.path.join(path, "config.json")
    d = read_json(cfg_path)
    gen_path = os.path.join(path, GENERATION_CONFIG)
    gen = read_json(gen_path) if os.path.lexists(gen_path) else None
    text = d.get("text_config") if isinstance(d.get("text_config"), dict) else {}
    vocab = text.get("vocab_size")
    if gen is not None and isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
        check_generation_config(gen, vocab, gen_path)
    try:
        return from_dict(d, gen)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{cfg_path}: {e}") from None
