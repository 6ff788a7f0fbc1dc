"""Sampling parameters, with vLLM's names and meanings.

Every field is validated once in ``__post_init__``; an invalid value raises ``ValueError`` naming
the field and the accepted range.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, List, Optional, Union

from pagedllm.sparse.options import parse_sparse_attention

# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): dividing logits by a tinier
# one overflows float32 and makes the probabilities NaN.
GREEDY_TEMPERATURE = 1e-5
# Largest accepted top_k, logprobs and token id (the kernels and torch index with int32/int64).
MAX_INT32 = (1 << 31) - 1
# Seeds are 64-bit signed on the engine side (torch.Generator.manual_seed).
MAX_SEED = (1 << 63) - 1


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


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
        stop: strings that end the completion (not included in the text unless
            ``include_stop_str_in_output``).
        stop_token_ids: token ids that end the completion (included in the token ids).
        ignore_eos: keep generating after EOS.
        presence_penalty: subtracted from the logits of tokens already generated.
        frequency_penalty: subtracted once per earlier occurrence in the generated tokens.
        repetition_penalty: divides positive (multiplies negative) logits of tokens seen in the
            prompt or the output; 1 = off.
        logprobs: number of top logprobs returned per generated token, plus the sampled one.
        prompt_logprobs: number of top logprobs returned per prompt token, plus the actual one.
        include_stop_str_in_output: keep the matched stop string in the text.
        skip_special_tokens: leave special tokens out of the decoded text.
        detokenize: produce text (False: token ids only).
        sparse_attention: this request's block-sparse decode attention, a mapping with the
            keys of pagedllm.sparse.SparseAttentionConfig ("strategy" required; "dense" turns
            the engine's default off), overriding the engine's default; None: the default.
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
    detokenize: bool = True
    sparse_attention: Optional[Any] = None

    def __post_init__(self) -> None:
        if self.best_of is None:
            self.best_of = self.n
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        stop_ids = list(self.stop_token_ids or [])
        if any(not _is_int(t) for t in stop_ids):
            raise ValueError(f"SamplingParams.stop_token_ids must be a list of integers, got "
                             f"{self.stop_token_ids!r}")
        self.stop_token_ids = [int(t) for t in stop_ids]
        if self.top_k == 0:
            self.top_k = -1
        self.sparse_attention = parse_sparse_attention(self.sparse_attention,
                                                       "SamplingParams.sparse_attention")
        self._validate()

    def _validate(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"SamplingParams.{name} must be {expected}, got {getattr(self, name)!r}")

        if not _is_int(self.n) or not 1 <= self.n <= MAX_INT32:
            raise bad("n", "an integer >= 1")
        if not _is_int(self.best_of) or not self.n <= self.best_of <= MAX_INT32:
            raise bad("best_of", f"an integer >= n ({self.n})")
        if not _is_real(self.temperature) or self.temperature < 0.0:
            raise bad("temperature", "a finite number >= 0")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if not _is_int(self.top_k) or not -1 <= self.top_k <= MAX_INT32:
            raise bad("top_k", f"-1, 0 (all tokens) or an integer in [1, {MAX_INT32}]")
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise bad("seed", f"an integer in [0, {MAX_SEED}] or None")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or
                                            not 1 <= self.max_tokens <= MAX_INT32):
            raise bad("max_tokens", "an integer >= 1 or None")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= MAX_INT32:
            raise bad("min_tokens", "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        if not _is_real(self.presence_penalty) or not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]")
        if not _is_real(self.frequency_penalty) or not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]")
        if not _is_real(self.repetition_penalty) or self.repetition_penalty <= 0.0:
            raise bad("repetition_penalty", "a finite number > 0")
        if self.logprobs is not None and (not _is_int(self.logprobs) or
                                          not 0 <= self.logprobs <= MAX_INT32):
            raise bad("logprobs", "an integer >= 0 or None")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs) or
                                                 not 0 <= self.prompt_logprobs <= MAX_INT32):
            raise bad("prompt_logprobs", "an integer >= 0 or None")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a non-empty string or a list of non-empty strings")
        if any(not 0 <= t <= MAX_INT32 for t in self.stop_token_ids):
            raise bad("stop_token_ids", f"a list of token ids in [0, {MAX_INT32}]")

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature below 1e-5, or top_k 1)."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1


@dataclass
class BeamSearchParams:
    """Beam search parameters (vLLM's ``BeamSearchParams``).

    Args:
        beam_width: beams kept at every step.
        max_tokens: most tokens generated per beam.
        ignore_eos: keep extending beams past EOS.
        temperature: applied to the logits before the log-softmax that ranks candidates (0 = 1).
        length_penalty: final score = cumulative logprob / (length ** length_penalty).
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            raise ValueError(f"BeamSearchParams.beam_width must be an integer >= 1, got {self.beam_width!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"BeamSearchParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_real(self.temperature) or self.temperature < 0.0:
            raise ValueError(f"BeamSearchParams.temperature must be a finite number >= 0, got "
                             f"{self.temperature!r}")
        if not _is_real(self.length_penalty):
            raise ValueError(f"BeamSearchParams.length_penalty must be a finite number, got "
                             f"{self.length_penalty!r}")
