"""Unknown request fields: ignored with a warning, as vLLM does (or refused with
ServerSettings.strict_fields). The names go to the log and to the ``X-Ignored-Fields``
response header, so a client can see that a setting had no effect."""

from __future__ import annotations

import logging
from typing import Dict

from pydantic import BaseModel

from pagedllm.server.protocol import extra_fields

logger = logging.getLogger("pagedllm.server")

HEADER = "X-Ignored-Fields"
_MAX_HEADER_CHARS = 512


def ignored_fields_header(request: BaseModel, strict: bool, route: str) -> Dict[str, str]:
    """Checks a request's unknown fields and says which were ignored.

    Args:
        request: the parsed body.
        strict: refuse unknown fields (400) instead of ignoring them.
        route: the route, for the log line.
    Returns:
        {} when nothing was ignored, else {"X-Ignored-Fields": "a, b"} (ASCII-safe, capped).
    Raises:
        OpenAIError: 400 from extra_fields().
    """
    names = extra_fields(request, strict)
    if not names:
        return {}
    logger.warning("%s: ignoring unknown request fields: %s", route, ", ".join(map(repr, names)))
    value = ", ".join(names).encode("ascii", "replace").decode("ascii")
    value = "".join(c if 32 <= ord(c) < 127 else "?" for c in value)[:_MAX_HEADER_CHARS]
    return {HEADER: value}
