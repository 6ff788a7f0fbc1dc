"""The persistent KV tier's model fingerprint: a digest of everything that shapes a block's bytes,
so that records written by one model (or dtype, layout) are never served to another.

Every byte of every weight file is hashed (XXH3-128 in C++, `_core.file_digest`, at memory
speed without the GIL): a fine-tune of a few layers, a merged LoRA or an edited tensor with the
same shapes changes the fingerprint, which a sample of the weights would miss. So that a restart
does not read a multi-GB checkpoint again, each file's digest is kept in a small JSON cache (in
the store's directory) under the file's identity: its real path, device, inode, size, and
modification and status-change times in nanoseconds. Any write to the file changes its ctime,
which no tool can set back, so a cached digest is never served for changed contents.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Dict, Optional, Sequence, Tuple

from pagedllm import _core
from pagedllm.model.files import CheckpointError, read_json

logger = logging.getLogger("pagedllm")

DIGEST_CACHE_NAME = "model_digests.json"
_CACHE_VERSION = 1
_MAX_CACHED_FILES = 512


def _identity(path: str) -> Dict[str, int]:
    st = os.stat(path)
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _load_cache(cache_path: Optional[str]) -> Dict[str, dict]:
    if cache_path is None or not os.path.exists(cache_path):
        return {}
    try:
        data = read_json(cache_path)
    except CheckpointError as e:  # unreadable or not JSON: start over (it is only a cache)
        logger.debug("ignoring the model digest cache %s: %s", cache_path, e)
        return {}
    files = data.get("files") if data.get("version") == _CACHE_VERSION else None
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items() if isinstance(v, dict)}


def _save_cache(cache_path: Optional[str], files: Dict[str, dict], keep: Sequence[str]) -> None:
    """Writes the cache; past _MAX_CACHED_FILES entries only `keep` (this model's files)."""
    if cache_path is None:
        return
    if len(files) > _MAX_CACHED_FILES:
        files = {k: files[k] for k in keep if k in files}
    tmp = f"{cache_path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": _CACHE_VERSION, "files": files}, f)
        os.replace(tmp, cache_path)
    except OSError as e:  # a read-only store still serves; the digests are recomputed next time
        logger.debug("cannot write the model digest cache %s: %s", cache_path, e)
        try:
            os.unlink(tmp)
        except OSError:
            pass


def weights_digest(real: str, cache: Dict[str, dict]) -> Tuple[str, bool]:
    """The hex XXH3-128 of every byte of one weight file, from `cache` when its identity is
    unchanged (a new digest is added to the cache).

    Args:
        real: the file's real path (the cache key).
        cache: real path -> identity and digest (as _load_cache returns).
    Returns:
        (32 hex digits, whether the file was read: the cache changed).
    Raises:
        OSError: the file cannot be read (the message names it).
    """
    ident = _identity(real)
    entry = cache.get(real)
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in ident.items()) \
            and isinstance(entry.get("digest"), str):
        return entry["digest"], False
    digest = _core.file_digest(real).hex()
    if _identity(real) == ident:  # not changed while it was read: cacheable
        cache[real] = {**ident, "digest": digest}
    return digest, True


def model_fingerprint(model_path: str, parts: Sequence[str],
                      cache_path: Optional[str] = None) -> str:
    """A digest of what shapes a block's bytes: config.json, the name and full contents of
    every safetensors file, and `parts` (model dtype, KV dtype and scales, block size, layout).

    Args:
        model_path: the checkpoint directory.
        parts: further strings that must match for a block to be reusable.
        cache_path: a JSON file for the weight files' digests (None: digest every start).
    Returns:
        A hex digest (sha256 over the pieces).
    Raises:
        OSError: config.json or a weight file cannot be read.
    """
    h = hashlib.sha256(b"pagedllm-model-fingerprint-v2")
    with open(os.path.join(model_path, "config.json"), "rb") as f:
        h.update(f.read())
    cache = _load_cache(cache_path)
    used, changed = [], False
    for name in sorted(os.listdir(model_path)):
        if name.endswith(".safetensors"):
            real = os.path.realpath(os.path.join(model_path, name))
            digest, read = weights_digest(real, cache)
            used.append(real)
            changed |= read
            h.update(b"\0" + name.encode() + b"\0" + digest.encode())
    if changed:
        _save_cache(cache_path, cache, used)
    for p in parts:
        h.update(b"\0" + p.encode())
    return h.hexdigest()
