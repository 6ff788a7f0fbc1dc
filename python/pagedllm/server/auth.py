"""API-key authentication of the /v1 routes: ``Authorization: Bearer <key>``."""

from __future__ import annotations

import secrets
from typing import Callable, Optional

from fastapi import Request

from pagedllm.server.errors import OpenAIError

API_KEY_ENV = "PAGEDLLM_API_KEY"


def require_api_key(api_key: Optional[str]) -> Callable:
    """A FastAPI dependency that rejects requests without the key (401), or accepts all when
    `api_key` is None."""
    expected = api_key.encode("utf-8") if api_key else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header.strip():
            raise OpenAIError(401, "missing API key: send the header 'Authorization: Bearer "
                              "<key>'", code="invalid_api_key")
        if scheme.lower() != "bearer" or not token.strip():
            raise OpenAIError(401, "malformed Authorization header: expected 'Bearer <key>' "
                              "(the scheme 'Bearer', a space, then the key)",
                              code="invalid_api_key")
        if not secrets.compare_digest(token.strip().encode("utf-8"), expected):
            raise OpenAIError(401, "incorrect API key", code="invalid_api_key")

    return check
