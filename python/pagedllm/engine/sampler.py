"""Batched sampling with per-sequence parameters (vLLM's SamplingParams semantics).

Order of operations on each row of logits (as vLLM): repetition / frequency / presence
penalties, min_tokens suppression of EOS and stop tokens, then greedy argmax, or temperature,
top-k, top-p, min-p and a random draw. The draw uses the exponential-race trick
(argmax of p / q with q ~ Exp(1)), which needs one random number per vocabulary entry from the
sequence's own generator when the request is seeded, so a seeded sequence's tokens do not
depend on the rest of the batch. Temperatures below 1e-5 sample greedily (as vLLM), and a row
that the penalties pushed to all -inf or NaN falls back to its raw logits, so the
probabilities are never NaN. Reported logprobs are the model's raw log-softmax, before any
of the adjustments (vLLM's default "raw_logprobs").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence as Seq, Tuple

import torch

from pagedllm import _core
from pagedllm.engine.sequence import Sequence
from pagedllm.model.inference import inference
from pagedllm.sampling_params import SamplingParams


@dataclass
class SampleTarget:
    """One draw: which logits row, for which sequence, under which parameters."""

    row: int
    seq: Sequence
    params: SamplingParams


@dataclass
class SampleResult:
    """The outcome of one draw.

    Attributes:
        token_id: the chosen token.
        logprob: its raw logprob (None when not needed by the request).
        rank: its rank under the raw distribution (1 = most likely), when logprob is set.
        top: the top-k (token id, raw logprob) pairs, when the request asked for logprobs.
    """

    token_id: int
    logprob: Optional[float] = None
    rank: Optional[int] = None
    top: Optional[List[Tuple[int, float]]] = None


class Sampler:
    """Samples next tokens for a batch of sequences.

    Args:
        eos_token_ids: the model's end-of-sequence ids (suppressed until min_tokens).
        seed: seed of the shared generator used by requests without their own seed.
    """

    def __init__(self, eos_token_ids: Seq[int], seed: int = 0):
        self.eos_token_ids = list(eos_token_ids)
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)

    @inference
    def sample(self, logits: torch.Tensor, targets: List[SampleTarget]) -> List[SampleResult]:
        """Draws one token per target.

        Args:
            logits: float32 [num_rows, vocab]; several targets may share a row (forks).
            targets: the draws to make.
        Returns:
            One SampleResult per target, in order.
        """
        if not targets:
            return []
        if len(targets) == logits.shape[0] and self._all_plain_greedy(targets, logits.shape[1]):
            # one plain greedy target per row, in order (the common decode step): the argmax
            fast = _greedy_tokens(logits)
            if fast is not None:  # None: a non-finite row, handled below
                return [SampleResult(tok) for tok in fast]
        row_ids = [t.row for t in targets]
        if row_ids == list(range(logits.shape[0])):
            raw = logits.float()  # one target per row, in order: no gather copy
        else:
            raw = logits.index_select(0, torch.as_tensor(row_ids, dtype=torch.long)).float()
        # raw: [S, vocab]
        need_lp = [t.params.logprobs is not None or t.params.best_of > t.params.n for t in targets]
        if not any(need_lp) and all(self._plain_greedy(t, raw.shape[1]) for t in targets):
            fast = _greedy_tokens(raw)
            if fast is not None:  # None: a non-finite row, handled below
                return [SampleResult(tok) for tok in fast]
        raw_lp = torch.log_softmax(raw, dim=-1) if any(need_lp) else None  # [S, vocab]

        x = self._apply_penalties(raw, targets)
        x = self._suppress_until_min_tokens(x, targets)
        x = _keep_finite(x, raw)
        tokens = torch.empty(len(targets), dtype=torch.long)
        greedy = [i for i, t in enumerate(targets) if t.params.greedy]
        if greedy:
            g = torch.as_tensor(greedy, dtype=torch.long)
            tokens[g] = x.index_select(0, g).argmax(dim=-1)
        rand = [i for i, t in enumerate(targets) if not t.params.greedy]
        if rand:
            r = torch.as_tensor(rand, dtype=torch.long)
            tokens[r] = self._random(x.index_select(0, r), [targets[i] for i in rand])

        token_list = tokens.tolist()
        if raw_lp is None:
            return [SampleResult(tok) for tok in token_list]
        # Every row at once: the sampled token's logprob and rank, one top-k of the largest k.
        chosen = raw_lp.gather(1, tokens.unsqueeze(1))                      # [S, 1]
        lps = chosen.squeeze(1).tolist()
        ranks = ((raw_lp > chosen).sum(dim=1) + 1).tolist()
        k_max = min(max(t.params.logprobs or 0 for t in targets), raw_lp.shape[1])
        top_ids = top_vals = None
        if k_max > 0:
            vals, idx = torch.topk(raw_lp, k_max, dim=-1)
            top_ids, top_vals = idx.tolist(), vals.tolist()
        results = []
        for i, t in enumerate(targets):
            if not need_lp[i]:
                results.append(SampleResult(token_list[i]))
                continue
            k = t.params.logprobs or 0
            top = list(zip(top_ids[i][:k], top_vals[i][:k])) if k > 0 else None
            results.append(SampleResult(token_list[i], lps[i], ranks[i], top))
        return results

    # --- logits processing --------------------------------------------------------------------
    @staticmethod
    def _apply_penalties(x: torch.Tensor, targets: List[SampleTarget]) -> torch.Tensor:
        todo = [i for i, t in enumerate(targets)
                if t.params.repetition_penalty != 1.0 or t.params.frequency_penalty != 0.0
                or t.params.presence_penalty != 0.0]
        if not todo:
            return x
        x = x.clone()
        vocab = x.shape[1]
        for i in todo:
            p, seq = targets[i].params, targets[i].seq
            out_ids = torch.as_tensor(seq.output_token_ids, dtype=torch.long)
            out_ids = out_ids[(out_ids >= 0) & (out_ids < vocab)]
            counts = torch.bincount(out_ids, minlength=vocab).to(x.dtype)  # [vocab]
            row = x[i]
            if p.repetition_penalty != 1.0:
                seen = (counts > 0) | _prompt_mask(seq.request, vocab)
                row[seen] = torch.where(row[seen] > 0, row[seen] / p.repetition_penalty,
                                        row[seen] * p.repetition_penalty)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)
        return x

    def _banned(self, t: SampleTarget, vocab: int) -> List[int]:
        """The token ids t may not draw yet (EOS and stop tokens until min_tokens)."""
        if t.seq.num_output_tokens >= t.params.min_tokens:
            return []
        banned = set(t.params.stop_token_ids)
        if not t.params.ignore_eos:
            banned.update(self.eos_token_ids)
        return [b for b in banned if 0 <= b < vocab]

    def _all_plain_greedy(self, targets: List[SampleTarget], vocab: int) -> bool:
        """Whether target i reads row i and is the argmax of it, for every i: its params
        plain_greedy (the request's copy, read once) and no token banned yet (one loop, the
        common decode step's test)."""
        for i, t in enumerate(targets):
            p, req = t.params, t.seq.request
            if t.row != i:
                return False
            plain = req.plain_greedy if p is req.params else p.plain_greedy  # the former set once
            if not plain or (p.min_tokens and self._banned(t, vocab)):
                return False
        return True

    def _plain_greedy(self, t: SampleTarget, vocab: int) -> bool:
        """Whether t is an argmax of its raw logits: greedy, no penalty, nothing banned."""
        p = t.params
        return (p.greedy and p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0
                and p.presence_penalty == 0.0 and not self._banned(t, vocab))

    def _suppress_until_min_tokens(self, x: torch.Tensor, targets: List[SampleTarget]) -> torch.Tensor:
        cloned = False
        for i, t in enumerate(targets):
            banned = self._banned(t, x.shape[1])
            if banned:
                if not cloned:
                    x, cloned = x.clone(), True
                x[i, banned] = float("-inf")
        return x

    def _random(self, x: torch.Tensor, targets: List[SampleTarget]) -> torch.Tensor:
        """The exponential race over _probs: each row's argmax of p / q, q ~ Exp(1) from the
        row's own generator when seeded, else the shared one. x: [R, vocab]; returns [R]."""
        probs = self._probs(x, targets)                                         # [R, vocab]
        q = torch.empty_like(probs)
        shared = [i for i, t in enumerate(targets) if t.seq.generator is None]
        if shared:
            idx = torch.as_tensor(shared, dtype=torch.long)
            q[idx] = torch.empty((len(shared), probs.shape[1]), dtype=probs.dtype).exponential_(
                generator=self.generator)
        for i, t in enumerate(targets):
            if t.seq.generator is not None:
                q[i].exponential_(generator=t.seq.generator)
        return (probs / q).argmax(dim=-1)

    @staticmethod
    def _probs(x: torch.Tensor, targets: List[SampleTarget]) -> torch.Tensor:
        """The distribution each row draws from: temperature, then top-k (rows with top_k > 0
        only), top-p (rows with top_p < 1 only: on a top_p = 1 row the float32 cumulative sum
        can reach 1 before the row's tail and drop those tokens), then min-p. A row's result
        does not depend on the other rows of the batch.

        Args:
            x: float32 [R, vocab] logits, finite or -inf, one row per target.
            targets: the R targets (their temperature, top_k, top_p and min_p).
        Returns:
            float32 [R, vocab] probabilities (rows sum to 1 before min-p zeroes entries).
        """
        temps = torch.as_tensor([t.params.temperature for t in targets], dtype=x.dtype)
        x = x / temps.unsqueeze(1)
        top_k = [t.params.top_k for t in targets]
        top_p = [t.params.top_p for t in targets]
        min_p = [t.params.min_p for t in targets]
        use_p = [p < 1.0 for p in top_p]
        if any(k > 0 for k in top_k) or any(use_p):
            vocab = x.shape[1]
            sorted_x, order = torch.sort(x, dim=-1, descending=True)          # [R, vocab]
            k = torch.as_tensor([min(k, vocab) if k > 0 else vocab for k in top_k]).unsqueeze(1)
            # below the k-th largest value: tokens tied with it stay (transformers' and vLLM's
            # top-k; cutting at position k dropped some of the tied ones by their sort order)
            drop = sorted_x < sorted_x.gather(1, k - 1)                         # beyond top-k
            if any(use_p):
                probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
                before = torch.cumsum(probs, dim=-1) - probs                   # mass above
                p = torch.as_tensor(top_p, dtype=x.dtype).unsqueeze(1)
                drop |= (before >= p) & torch.as_tensor(use_p).unsqueeze(1)   # top_p < 1 rows
            drop[:, 0] = False                                                  # keep the best
            x = x.scatter(1, order, sorted_x.masked_fill(drop, float("-inf")))
        probs = torch.softmax(x, dim=-1)                                        # [R, vocab]
        if any(p > 0.0 for p in min_p):
            floor = torch.as_tensor(min_p, dtype=x.dtype).unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
            probs = torch.where(probs < floor, torch.zeros_like(probs), probs)
        return probs


def _greedy_tokens(raw: torch.Tensor) -> Optional[List[int]]:
    """Each row's argmax in one vectorised pass (`_core.argmax_rows`: no probabilities, no
    copies; torch's argmax is scalar here, 10x slower), or None when a row's maximum is not a
    finite float above the lowest one (NaN and +-inf rows take the exact path of _keep_finite,
    which this equals on every other row).

    Args:
        raw: float32 [S, vocab] on the CPU, one row per target.
    """
    if (raw.shape[1] == 0 or raw.dtype != torch.float32 or raw.device.type != "cpu"
            or raw.stride(1) != 1):
        return None
    return _core.greedy_tokens(raw)


def _keep_finite(x: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """x with NaN as -inf, +inf as the largest float, and rows with no finite entry left (a
    huge repetition penalty on an all-negative row) replaced by their raw logits."""
    # NaN and +-inf show in the min or the max: two reductions, not a [S, vocab] bool tensor
    # (12-18x cheaper; the full check cost 18 ms a step at batch 256 x 32k vocabulary).
    if x.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):
        return x
    big = torch.finfo(x.dtype).max
    x = torch.nan_to_num(x, nan=float("-inf"), posinf=big)
    dead = ~torch.isfinite(x).any(dim=-1)                                     # [S]
    if bool(dead.any()):
        x = torch.where(dead.unsqueeze(1), torch.nan_to_num(raw, nan=0.0, posinf=big), x)
    return x


def _prompt_mask(req, vocab: int) -> torch.Tensor:
    """[vocab] bool: the tokens of req's prompt (made once per request, not per step)."""
    if req.prompt_token_mask is None or req.prompt_token_mask.shape[0] != vocab:
        ids = torch.as_tensor(req.prompt_token_ids, dtype=torch.long)
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[ids[(ids >= 0) & (ids < vocab)]] = True
        req.prompt_token_mask = mask
    return req.prompt_token_mask
