"""Sampling parameters, with vLLM's names and meanings.

Every field is validated once in ``__post_init__``; an invalid value raises ``ValueError`` naming
the field and the accepted range.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, List, Optional, Union

import numpy as np

from pagedllm.sparse.options import parse_sparse_attention

# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): dividing logits by a tinier
# one overflows float32 and makes the probabilities NaN.
GREEDY_TEMPERATURE = 1e-5
# Largest accepted top_k and token id (the kernels and torch index with int32/int64).
MAX_INT32 = (1 << 31) - 1
# Seeds are 64-bit signed on the engine side (torch.Generator.manual_seed).
MAX_SEED = (1 << 63) - 1
# Most top logprobs per token (logprobs, prompt_logprobs): vLLM's default max_logprobs.
MAX_LOGPROBS = 20


def _is_int(x) -> bool:
    """Whether x is an integer: int or a numpy integer, never a bool (nor numpy.bool_)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _is_int_in(x, lo: int, hi: int) -> bool:
    """Whether x is an integer (as _is_int) in [lo, hi]."""
    return _is_int(x) and lo <= x <= hi


def _is_bool(x) -> bool:
    """Whether x is True or False (bool or numpy.bool_; not 0, 1, "no", ...)."""
    return isinstance(x, (bool, np.bool_))


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) and math.isfinite(x)


def _bad(owner: str, name: str, expected: str, value: Any) -> ValueError:
    """The ValueError for field `name` of class `owner` whose value is not `expected`."""
    return ValueError(f"{owner}.{name} must be {expected}, got {value!r}")


def _stop_strings(value: Any) -> List[str]:
    """SamplingParams.stop as a list: None, a non-empty string, or a list / tuple of them.

    Raises:
        ValueError: for anything else (naming SamplingParams.stop).
    """
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or any(not isinstance(s, str) or not s for s in items):
        raise _bad("SamplingParams", "stop", "a non-empty string or a list of non-empty strings",
                   value)
    return list(items)


def _token_ids(value: Any) -> List[int]:
    """SamplingParams.stop_token_ids as a list of ints: None, a list / tuple of integers
    (numpy integers included, bools not), or a 1-D integer numpy array; each in [0, 2^31 - 1].

    Raises:
        ValueError: for anything else (naming SamplingParams.stop_token_ids).
    """
    if value is None:
        return []
    if isinstance(value, np.ndarray):
        ok = value.ndim == 1 and np.issubdtype(value.dtype, np.integer)
        items = value.tolist() if ok else None
    else:
        items = list(value) if isinstance(value, (list, tuple)) else None
    if items is None or any(not _is_int_in(t, 0, MAX_INT32) for t in items):
        raise _bad("SamplingParams", "stop_token_ids", f"a list of token ids in [0, {MAX_INT32}]",
                   value)
    return [int(t) for t in items]


# SamplingParams' integer fields (None allowed where the default is None) and bool fields.
_INT_FIELDS = ("n", "best_of", "top_k", "seed", "max_tokens", "min_tokens", "logprobs",
               "prompt_logprobs")
_BOOL_FIELDS = ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                "spaces_between_special_tokens", "detokenize")


@dataclass
class SamplingParams:
    """How to sample the completions of one request (vLLM-compatible subset).

    Args:
        n: completions returned for the request.
        best_of: completions generated, of which the ``n`` with the highest cumulative logprob
            are returned (default ``n``).
        temperature: 0 (or anything below 1e-5) means greedy; higher values flatten the
            distribution.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p`` (1 = all).
        top_k: keep the ``top_k`` most likely tokens (-1 or 0 = all; at most 2^31 - 1).
        min_p: drop tokens whose probability is below ``min_p`` times the top token's.
        seed: per-request seed in [0, 2^63 - 1]; the same seed gives the same output whatever
            else is running.
        max_tokens: most tokens to generate (None: up to the model's length limit).
        min_tokens: EOS and ``stop_token_ids`` are suppressed until this many were generated.
        stop: a non-empty string or a list / tuple of them that end the completion (not
            included in the text unless ``include_stop_str_in_output``; needs ``detokenize``).
        stop_token_ids: token ids that end the completion (included in the token ids): a list
            / tuple of integers or a 1-D integer numpy array.
        ignore_eos: keep generating after EOS.
        presence_penalty: subtracted from the logits of tokens already generated.
        frequency_penalty: subtracted once per earlier occurrence in the generated tokens.
        repetition_penalty: divides positive (multiplies negative) logits of tokens seen in the
            prompt or the output; 1 = off.
        logprobs: number of top logprobs returned per generated token, plus the sampled one
            (at most MAX_LOGPROBS, 20: vLLM's default max_logprobs).
        prompt_logprobs: number of top logprobs returned per prompt token, plus the actual one
            (at most MAX_LOGPROBS).
        include_stop_str_in_output: keep the matched stop string in the text.
        skip_special_tokens: leave special tokens out of the decoded text.
        spaces_between_special_tokens: vLLM's option, accepted so that vLLM code runs
            unchanged; it acts only on Python ("slow") tokenizers, and a checkpoint's
            tokenizer.json is always a fast one, which joins special tokens as its decoder
            says (so does vLLM with a fast tokenizer).
        detokenize: produce text (False: token ids only; not with ``stop``).
        sparse_attention: this request's block-sparse decode attention, a mapping with the
            keys of pagedllm.sparse.SparseAttentionConfig ("strategy" required; "dense" turns
            the engine's default off), overriding the engine's default; None: the default.

    Integer fields take ints or numpy integers (stored as int), never bools; the bool fields
    (ignore_eos, include_stop_str_in_output, skip_special_tokens, spaces_between_special_tokens,
    detokenize) take only True
    or False (or numpy.bool_, stored as bool).
    """

    n: int = 1
    best_of: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    sparse_attention: Optional[Any] = None

    def __post_init__(self) -> None:
        if self.best_of is None:
            self.best_of = self.n
        self.stop = _stop_strings(self.stop)
        self.stop_token_ids = _token_ids(self.stop_token_ids)
        self.sparse_attention = parse_sparse_attention(self.sparse_attention,
                                                       "SamplingParams.sparse_attention")
        self._validate()
        for name in _INT_FIELDS:  # numpy integers become ints
            if getattr(self, name) is not None:
                setattr(self, name, int(getattr(self, name)))
        for name in _BOOL_FIELDS:  # numpy.bool_ becomes bool
            setattr(self, name, bool(getattr(self, name)))
        if self.top_k == 0:
            self.top_k = -1

    def _validate(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return _bad("SamplingParams", name, expected, getattr(self, name))

        if not _is_int_in(self.n, 1, MAX_INT32):
            raise bad("n", "an integer >= 1")
        if not _is_int_in(self.best_of, self.n, MAX_INT32):
            raise bad("best_of", f"an integer >= n ({self.n})")
        if not _is_real(self.temperature) or self.temperature < 0.0:
            raise bad("temperature", "a finite number >= 0")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if not _is_int_in(self.top_k, -1, MAX_INT32):
            raise bad("top_k", f"-1, 0 (all tokens) or an integer in [1, {MAX_INT32}]")
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if self.seed is not None and not _is_int_in(self.seed, 0, MAX_SEED):
            raise bad("seed", f"an integer in [0, {MAX_SEED}] or None")
        if self.max_tokens is not None and not _is_int_in(self.max_tokens, 1, MAX_INT32):
            raise bad("max_tokens", "an integer >= 1 or None")
        if not _is_int_in(self.min_tokens, 0, MAX_INT32):
            raise bad("min_tokens", "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        if not _is_real(self.presence_penalty) or not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]")
        if not _is_real(self.frequency_penalty) or not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]")
        if not _is_real(self.repetition_penalty) or self.repetition_penalty <= 0.0:
            raise bad("repetition_penalty", "a finite number > 0")
        if self.logprobs is not None and not _is_int_in(self.logprobs, 0, MAX_LOGPROBS):
            raise bad("logprobs", f"an integer in [0, {MAX_LOGPROBS}] (max_logprobs) or None")
        if self.prompt_logprobs is not None and not _is_int_in(self.prompt_logprobs, 0,
                                                                MAX_LOGPROBS):
            raise bad("prompt_logprobs",
                      f"an integer in [0, {MAX_LOGPROBS}] (max_logprobs) or None")
        for name in _BOOL_FIELDS:
            if not _is_bool(getattr(self, name)):
                raise bad(name, "True or False")
        if self.stop and not self.detokenize:
            raise ValueError(f"SamplingParams.stop requires SamplingParams.detokenize=True (stop "
                             f"strings are matched in the text), got stop={self.stop!r} with "
                             f"detokenize=False")

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature below 1e-5, or top_k 1)."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def plain_greedy(self) -> bool:
        """True when a draw is the argmax of the raw logits (while no token is banned): greedy,
        no penalty, no logprobs, no best_of ranking."""
        return (self.greedy and self.repetition_penalty == 1.0 and self.frequency_penalty == 0.0
                and self.presence_penalty == 0.0 and self.logprobs is None
                and self.best_of <= self.n)


@dataclass
class BeamSearchParams:
    """Beam search parameters (vLLM's ``BeamSearchParams``).

    Args:
        beam_width: beams kept at every step.
        max_tokens: most tokens generated per beam.
        ignore_eos: keep extending beams past EOS.
        temperature: applied to the logits before the log-softmax that ranks candidates (0 = 1).
        length_penalty: final score = cumulative logprob / (length ** length_penalty).

    Integer fields take ints or numpy integers (stored as int), never bools; ignore_eos takes
    only True or False (or numpy.bool_).
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return _bad("BeamSearchParams", name, expected, getattr(self, name))

        if not _is_int_in(self.beam_width, 1, MAX_INT32):
            raise bad("beam_width", "an integer >= 1")
        if not _is_int_in(self.max_tokens, 1, MAX_INT32):
            raise bad("max_tokens", "an integer >= 1")
        if not _is_bool(self.ignore_eos):
            raise bad("ignore_eos", "True or False")
        if not _is_real(self.temperature) or self.temperature < 0.0:
            raise bad("temperature", "a finite number >= 0")
        if not _is_real(self.length_penalty):
            raise bad("length_penalty", "a finite number")
        self.beam_width, self.max_tokens = int(self.beam_width), int(self.max_tokens)
        self.ignore_eos = bool(self.ignore_eos)
