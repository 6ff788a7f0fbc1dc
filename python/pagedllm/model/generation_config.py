"""generation_config.json: validated at load, and the sampling defaults it gives.

A checkpoint's generation_config.json sets the defaults of requests that leave a knob unset
(vLLM's behaviour). transformers and vLLM accept any value there and then fail every request
that uses it (temperature -1, top_p 2, an eos id past the vocabulary); pagedllm refuses such a
file when the model loads, with a CheckpointError naming the file, the field, the value and
what is expected. `null` means unset. Fields pagedllm does not use are not looked at.

    read_generation_defaults("path/to/llama", vocab_size=32000)
    # {'temperature': 0.6, 'top_p': 0.9, 'max_tokens': 256}
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional

from pagedllm.model.errors import CheckpointError
from pagedllm.model.files import read_json

GENERATION_CONFIG = "generation_config.json"
# Sampling knobs taken over as request defaults (max_new_tokens becomes max_tokens).
DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Largest top_k / max_new_tokens accepted (the sampler and scheduler count in 32-bit ints).
MAX_INT_KNOB = (1 << 31) - 1
# Token-id fields checked against the vocabulary.
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id")


def generation_config_problem(gen: Mapping[str, Any], vocab_size: int) -> Optional[str]:
    """The first invalid value pagedllm would use, or None.

    Args:
        gen: the parsed generation_config.json.
        vocab_size: the model's vocabulary size (token ids must be in [0, vocab_size)).
    Returns:
        "field = value: expected ..." or None when every used field is valid.
    """
    def number(key: str) -> Optional[float]:
        v = gen.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _Bad(f"{key} = {v!r}: expected a finite number")
        return float(v)

    try:
        checks = (
            ("temperature", lambda x: x >= 0.0, ">= 0 (0 = greedy)"),
            ("top_p", lambda x: 0.0 < x <= 1.0, "in (0, 1]"),
            ("min_p", lambda x: 0.0 <= x <= 1.0, "in [0, 1]"),
            ("repetition_penalty", lambda x: x > 0.0, "> 0"),
        )
        for key, ok, expected in checks:
            x = number(key)
            if x is not None and not ok(x):
                raise _Bad(f"{key} = {gen[key]!r}: expected a number {expected}")
        top_k = gen.get("top_k")
        if top_k is not None and (not _is_int(top_k) or not -1 <= top_k <= MAX_INT_KNOB):
            raise _Bad(f"top_k = {top_k!r}: expected -1, 0 (all tokens) or a positive integer "
                       f"up to {MAX_INT_KNOB}")
        max_new = gen.get("max_new_tokens")
        if max_new is not None and (not _is_int(max_new) or not 1 <= max_new <= MAX_INT_KNOB):
            raise _Bad(f"max_new_tokens = {max_new!r}: expected a positive integer up to "
                       f"{MAX_INT_KNOB}")
        do_sample = gen.get("do_sample")
        if do_sample is not None and not isinstance(do_sample, bool):
            raise _Bad(f"do_sample = {do_sample!r}: expected true or false")
        for key in TOKEN_ID_KEYS:
            problem = token_ids_problem(key, gen.get(key), vocab_size)
            if problem:
                raise _Bad(problem)
    except _Bad as e:
        return str(e)
    return None


def token_ids_problem(key: str, value: Any, vocab_size: int) -> Optional[str]:
    """Why `value` (an id, a list of ids or null) is not a valid token id field, or None.

    Args:
        key: the field name, for the message.
        value: the field's value.
        vocab_size: ids must be in [0, vocab_size).
    Returns:
        A message naming the field, the value and the range, or None.
    """
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    for v in values:
        if not _is_int(v):
            return f"{key} = {value!r}: expected a token id or a list of token ids"
        if not 0 <= v < vocab_size:
            return f"{key} = {value!r}: token id {v} is outside the vocabulary [0, {vocab_size})"
    return None


def check_generation_config(gen: Mapping[str, Any], vocab_size: int, path: str) -> None:
    """Raises CheckpointError("<path>: <problem>") if generation_config_problem finds one.

    Args:
        gen: the parsed file.
        vocab_size: the model's vocabulary size.
        path: the file, named in the message.
    """
    problem = generation_config_problem(gen, vocab_size)
    if problem:
        raise CheckpointError(f"{path}: {problem}")


def read_generation_defaults(path: str | os.PathLike, vocab_size: int) -> dict[str, Any]:
    """Validated request defaults from a checkpoint's generation_config.json.

    Args:
        path: the checkpoint directory (a missing generation_config.json gives {}).
        vocab_size: the model's vocabulary size.
    Returns:
        temperature, top_p, top_k, min_p, repetition_penalty and max_tokens (from
        max_new_tokens) where set; temperature 0.0 when do_sample is false (greedy, as
        transformers does). top_k above vocab_size is lowered to vocab_size (same meaning).
    Raises:
        CheckpointError: the file is not a regular file, not a JSON object, or has an invalid
            value (see generation_config_problem).
    """
    file = os.path.join(os.fspath(path), GENERATION_CONFIG)
    if not os.path.lexists(file):
        return {}
    gen = read_json(file)
    check_generation_config(gen, vocab_size, file)
    out: dict[str, Any] = {k: gen[k] for k in DEFAULT_KEYS if gen.get(k) is not None}
    for key in ("temperature", "top_p", "min_p", "repetition_penalty"):
        if key in out:
            out[key] = float(out[key])
    if "top_k" in out:
        out["top_k"] = min(out["top_k"], vocab_size)
    if gen.get("max_new_tokens") is not None:
        out["max_tokens"] = gen["max_new_tokens"]
    if gen.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


class _Bad(Exception):
    pass


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
