"""Hostile sampling parameters (issue 20, defects 1 and 9): every numeric field is range-checked
where it enters (SamplingParams), and extreme but valid values never make NaN probabilities."""

import math

import pytest
import torch

from pagedllm.engine.sampler import Sampler, SampleTarget
from pagedllm.engine.sequence import Request
from pagedllm.sampling_params import BeamSearchParams, SamplingParams


def target(row, prompt, output, **params):
    req = Request(str(row), None, prompt, SamplingParams(**params))
    seq = req.seqs[0]
    seq.token_ids.extend(output)
    return SampleTarget(row, seq, req.params)


@pytest.mark.parametrize("field,value", [
    ("top_k", 2 ** 63), ("top_k", 2 ** 31), ("top_k", -2), ("top_k", 1.5), ("top_k", True),
    ("n", 0), ("n", 2 ** 63), ("n", True),
    ("best_of", 2 ** 40),
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", -1e-9),
    ("top_p", float("nan")), ("top_p", 0.0), ("min_p", float("nan")), ("min_p", 1.5),
    ("seed", -1), ("seed", 2 ** 63), ("seed", 1.0),
    ("max_tokens", 0), ("max_tokens", 2 ** 63),
    ("min_tokens", -1),
    ("presence_penalty", float("nan")), ("presence_penalty", 2.5),
    ("frequency_penalty", float("-inf")), ("repetition_penalty", float("inf")),
    ("repetition_penalty", 0.0), ("repetition_penalty", float("nan")),
    ("logprobs", -1), ("logprobs", 2 ** 63), ("prompt_logprobs", -1),
    ("logprobs", 21), ("prompt_logprobs", 10 ** 6),
    ("stop_token_ids", [2 ** 63]), ("stop_token_ids", [-1]), ("stop_token_ids", ["1"]),
])
def test_out_of_range_values_raise_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})


def test_boundary_values_are_accepted():
    p = SamplingParams(top_k=2 ** 31 - 1, seed=2 ** 63 - 1, temperature=0.0, top_p=1.0,
                       repetition_penalty=1e30, presence_penalty=-2.0, frequency_penalty=2.0)
    assert p.top_k == 2 ** 31 - 1 and p.seed == 2 ** 63 - 1
    assert SamplingParams(top_k=0).top_k == -1


def test_beam_search_params_are_finite():
    with pytest.raises(ValueError, match="length_penalty"):
        BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=float("nan"))
    with pytest.raises(ValueError, match="temperature"):
        BeamSearchParams(beam_width=2, max_tokens=4, temperature=float("inf"))


@pytest.mark.parametrize("t", [1e-45, 1e-30, 1e-6, 9.99e-6])
def test_tiny_temperatures_are_greedy(t):
    assert SamplingParams(temperature=t).greedy
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 50, generator=g) * 4
    targets = [target(i, [0], [], temperature=t, logprobs=1) for i in range(3)]
    results = Sampler(eos_token_ids=[]).sample(logits, targets)
    assert [r.token_id for r in results] == logits.argmax(dim=-1).tolist()
    assert all(math.isfinite(r.logprob) for r in results)


def test_smallest_sampling_temperature_gives_finite_probabilities():
    # 1e-5 is the first temperature that samples: logits / 1e-5 must stay finite.
    logits = torch.tensor([[30.0, 29.0, -30.0, 0.0]])
    t = target(0, [0], [], temperature=1e-5, seed=3)
    assert not t.params.greedy
    (r,) = Sampler(eos_token_ids=[]).sample(logits, [t])
    assert r.token_id == 0


def test_huge_repetition_penalty_on_an_all_negative_row_stays_finite():
    # Every token was seen and every logit is negative: x * 1e38 is -inf everywhere, which made
    # the softmax NaN. The row falls back to its raw logits.
    logits = -torch.arange(1.0, 9.0).unsqueeze(0)              # [1, 8], best is token 0
    seen = list(range(8))
    for temperature in (0.0, 0.7):
        t = target(0, seen, seen, temperature=temperature, repetition_penalty=1e38,
                   frequency_penalty=2.0, presence_penalty=2.0, seed=5)
        (r,) = Sampler(eos_token_ids=[]).sample(logits, [t])
        assert 0 <= r.token_id < 8
    t = target(0, seen, seen, temperature=0.0, repetition_penalty=1e38)
    (r,) = Sampler(eos_token_ids=[]).sample(logits, [t])
    assert r.token_id == 0


def test_nan_logits_are_never_sampled():
    logits = torch.tensor([[float("nan"), 1.0, 2.0, float("nan")]])
    for temperature in (0.0, 1.0):
        (r,) = Sampler(eos_token_ids=[]).sample(logits, [target(0, [0], [], temperature=temperature,
                                                                 top_k=2, seed=1)])
        assert r.token_id in (1, 2)
