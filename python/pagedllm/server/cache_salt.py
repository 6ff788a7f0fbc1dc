"""Prefix-cache namespaces per tenant (vLLM's ``cache_salt``, advisory GHSA-rm76-4mrf-v9r8).

A cached prompt answers faster than a fresh one, so a client that can hit another client's
cached blocks can learn its prompts from timings. A request's ``cache_salt``, and with
``cache_salt_by_api_key`` its bearer token, are hashed into the engine's ``extra_key``, which
keys every block of the request: requests with different salts never share a cached block.
"""

from __future__ import annotations

import hashlib
from typing import Optional

from fastapi import Request


def bearer_token(request: Request) -> Optional[str]:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def cache_key(salt: Optional[str], api_key: Optional[str]) -> int:
    """The engine's prefix-cache namespace for a request.

    Args:
        salt: the request's cache_salt (None: none).
        api_key: the client's bearer token when salting by API key (None: not salted by key).
    Returns:
        0 (the shared namespace) when neither is set, else a non-zero 63-bit hash of both.
    """
    if salt is None and api_key is None:
        return 0
    h = hashlib.sha256()
    for part in (api_key, salt):
        data = b"" if part is None else part.encode("utf-8")
        h.update(b"1" if part is not None else b"0")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return (int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)) or 1


def request_cache_key(request: Request, salt: Optional[str], by_api_key: bool) -> int:
    """cache_key() of an HTTP request: its cache_salt, and its bearer token if `by_api_key`."""
    return cache_key(salt, bearer_token(request) if by_api_key else None)
