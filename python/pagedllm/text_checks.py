"""Checks of user text before it reaches the tokenizer.

JSON (and Python) strings may hold lone UTF-16 surrogates (U+D800..U+DFFF), which UTF-8 cannot
encode: the tokenizer would raise a TypeError deep inside. They are found here first, so the
caller can name the field.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_at(text: str) -> int:
    """The index of the first lone surrogate in `text`, or -1 when there is none.

    Args:
        text: any str.
    Returns:
        An index into `text`, or -1.
    """
    m = _SURROGATE.search(text)
    return m.start() if m else -1


def check_text(text: str, where: str) -> None:
    """Raises ValueError naming `where` when `text` holds a lone surrogate.

    Args:
        text: the text to check.
        where: the argument or field that carried it (named in the error).
    Raises:
        ValueError: "<where>: lone surrogate U+D800 at index 3 (the text is not valid
            Unicode; encode it as UTF-8 first)".
    """
    at = lone_surrogate_at(text)
    if at >= 0:
        raise ValueError(f"{where}: lone surrogate U+{ord(text[at]):04X} at index {at} (the "
                         "text is not valid Unicode: a surrogate must be part of a pair)")
