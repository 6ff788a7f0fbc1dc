"""Refusing request bodies whose strings are not valid Unicode (lone surrogates), with a 400
naming where the bad string is (e.g. ``messages.0.content``)."""

from __future__ import annotations

from typing import Any

from pagedllm.server.errors import bad_request
from pagedllm.text_checks import check_text


def check_strings(data: Any, path: str = "") -> None:
    """Walks a parsed JSON value and rejects the first string (or key) with a lone surrogate.

    Args:
        data: dicts, lists and scalars as json.loads made them.
        path: the dotted location of `data` in the body ("" at the top).
    Raises:
        OpenAIError: 400 whose param is the dotted path of the bad string.
    """
    if isinstance(data, str):
        try:
            check_text(data, path or "body")
        except ValueError as e:
            raise bad_request(str(e), path or None) from None
    elif isinstance(data, dict):
        for k, v in data.items():
            key = str(k)
            here = f"{path}.{key}" if path else key
            check_strings(key, here)
            check_strings(v, here)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            check_strings(v, f"{path}.{i}" if path else str(i))
