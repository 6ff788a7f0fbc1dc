"""The sampler's greedy fast path (one vectorised argmax when every target is plain greedy)
against a plain Python model of greedy selection, and its hand-over to the exact path."""

import math

import pytest
import torch

from pagedllm.engine import sampler as sampler_mod
from pagedllm.engine.sampler import Sampler, SampleTarget
from pagedllm.engine.sequence import Request
from pagedllm.sampling_params import SamplingParams


def target(row, output=(), **params):
    req = Request(str(row), None, [5, 6], SamplingParams(**params))
    seq = req.seqs[0]
    seq.token_ids.extend(output)
    return SampleTarget(row, seq, req.params)


def python_greedy(row, banned=()):
    """The first index of the largest value, NaN as -inf, +inf as the largest float (the exact
    path's rules), banned ids skipped."""
    big = 3.4028234663852886e38
    vals = [(-math.inf if math.isnan(v) else big if v == math.inf else v) for v in row]
    vals = [-math.inf if i in banned else v for i, v in enumerate(vals)]
    return max(range(len(vals)), key=lambda i: (vals[i], -i))


def test_plain_greedy_batch_takes_the_fast_path_and_matches(monkeypatch):
    logits = torch.randn(64, 4096, generator=torch.Generator().manual_seed(0))
    logits[3, 10] = logits[3, 20] = logits[3].max() + 1           # a tie: the first wins
    calls = []
    real = sampler_mod._greedy_tokens
    monkeypatch.setattr(sampler_mod, "_greedy_tokens", lambda raw: calls.append(1) or real(raw))
    targets = [target(i, temperature=0.0) for i in range(64)]
    got = [r.token_id for r in Sampler(eos_token_ids=[2]).sample(logits, targets)]
    assert calls == [1]
    assert got == [python_greedy(r) for r in logits.tolist()]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_rows_go_to_the_exact_path(bad):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    logits[1, 7] = bad
    logits[2, :] = float("-inf")
    logits[2, 33] = -1.0
    targets = [target(i, temperature=0.0) for i in range(4)]
    got = [r.token_id for r in Sampler(eos_token_ids=[]).sample(logits, targets)]
    assert got == [python_greedy(r) for r in logits.tolist()]


def test_min_tokens_and_penalties_are_not_skipped():
    logits = torch.zeros(2, 8)
    logits[:, 2] = 5.0                                            # EOS is the argmax
    targets = [target(0, temperature=0.0, min_tokens=3),          # EOS banned for now
               target(1, output=[4], temperature=0.0, repetition_penalty=2.0)]
    logits[1, 4] = 6.0                                            # penalised: 6 / 2 < 5
    got = [r.token_id for r in Sampler(eos_token_ids=[2]).sample(logits, targets)]
    assert got == [python_greedy(logits[0].tolist(), banned={2}), 2]
