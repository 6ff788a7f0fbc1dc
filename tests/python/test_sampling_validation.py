"""SamplingParams / BeamSearchParams type checks and the sampler's batch independence.

Every bad field raises a ValueError naming the field (stop and stop_token_ids of the wrong type,
non-bool flags, logprobs above vLLM's max_logprobs, stop strings without detokenize), integer
fields take numpy integers but never bools in both classes, and a top_p = 1 row's distribution
does not depend on a batch neighbour using top-p or top-k.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch

from pagedllm.engine.sampler import Sampler, SampleTarget
from pagedllm.engine.sequence import Request
from pagedllm.sampling_params import MAX_LOGPROBS, BeamSearchParams, SamplingParams

BOOL_FIELDS = ["ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
               "spaces_between_special_tokens", "detokenize"]


# --- stop and stop_token_ids -------------------------------------------------------------------
@pytest.mark.parametrize("value", [5, 1.5, {"a"}, {"a": 1}, frozenset(["a"])])
def test_bad_stop_raises_value_error_naming_the_field(value):
    with pytest.raises(ValueError, match=r"SamplingParams\.stop must be a non-empty string or a "
                                         r"list of non-empty strings"):
        SamplingParams(stop=value)


@pytest.mark.parametrize("value", [
    5, "12", 1.0, {1, 2}, [True], [1, False], (1.5,), ["1"], [np.bool_(True)],
    np.array([[1, 2]]), np.array([1.0, 2.0]), np.array([True, False]), np.array(3),
    np.array([1, -1]), np.array([1, 2 ** 40]),
])
def test_bad_stop_token_ids_raise_value_error_naming_the_field(value):
    with pytest.raises(ValueError, match=r"SamplingParams\.stop_token_ids must be a list of token "
                                         r"ids in \[0, 2147483647\]"):
        SamplingParams(stop_token_ids=value)


def test_stop_and_stop_token_ids_accepted_forms_are_normalised():
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop=None).stop == []
    for value in (np.array([1, 2]), np.array([1, 2], dtype=np.uint32), (np.int64(1), 2), [1, 2]):
        ids = SamplingParams(stop_token_ids=value).stop_token_ids
        assert ids == [1, 2] and all(type(t) is int for t in ids)
    assert SamplingParams(stop_token_ids=np.array([], dtype=np.int64)).stop_token_ids == []
    # dataclasses.replace runs the checks again on the normalised values.
    p = dataclasses.replace(SamplingParams(stop="x", stop_token_ids=np.array([3])), min_tokens=1)
    assert p.stop == ["x"] and p.stop_token_ids == [3]


# --- bool fields --------------------------------------------------------------------------------
@pytest.mark.parametrize("field", BOOL_FIELDS)
@pytest.mark.parametrize("value", ["no", "False", 0, 1, None, 1.0, np.int64(1), [True]])
def test_bool_fields_reject_anything_but_true_or_false(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be True or False"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field", BOOL_FIELDS)
def test_bool_fields_accept_bools_and_store_python_bools(field):
    for value in (True, False, np.bool_(True), np.bool_(False)):
        got = getattr(SamplingParams(**{field: value}), field)
        assert type(got) is bool and got == bool(value)


# --- logprobs cap -------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [MAX_LOGPROBS + 1, 10 ** 6, 2 ** 31 - 1])
def test_logprobs_above_max_logprobs_are_refused(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be an integer in "
                                         rf"\[0, 20\] \(max_logprobs\) or None"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprobs_cap_is_max_logprobs_as_in_the_server(field):
    assert MAX_LOGPROBS == 20
    assert getattr(SamplingParams(**{field: MAX_LOGPROBS}), field) == 20
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}"):
        SamplingParams(**{field: MAX_LOGPROBS + 1})
    protocol = pytest.importorskip("pagedllm.server.protocol")
    assert protocol.MAX_LOGPROBS == MAX_LOGPROBS


# --- detokenize and stop ------------------------------------------------------------------------
@pytest.mark.parametrize("stop", ["x", ["a", "b"]])
def test_stop_strings_without_detokenize_are_refused(stop):
    with pytest.raises(ValueError, match=r"SamplingParams\.stop requires "
                                         r"SamplingParams\.detokenize=True") as e:
        SamplingParams(detokenize=False, stop=stop)
    assert "detokenize=False" in str(e.value)
    # stop token ids need no text, and an empty stop list is no stop string
    p = SamplingParams(detokenize=False, stop_token_ids=[5], stop=[])
    assert p.detokenize is False and p.stop == [] and p.stop_token_ids == [5]


# --- integer fields: numpy integers yes, bools no, in both classes ------------------------------
@pytest.mark.parametrize("field,value", [
    ("beam_width", True), ("beam_width", 2 ** 31), ("max_tokens", True),
    ("max_tokens", 2 ** 40), ("ignore_eos", "no"), ("ignore_eos", 1), ("ignore_eos", None),
])
def test_beam_search_params_reject_bools_and_non_integers(field, value):
    kwargs = {"beam_width": 2, "max_tokens": 4, field: value}
    with pytest.raises(ValueError, match=rf"BeamSearchParams\.{field} must be"):
        BeamSearchParams(**kwargs)


def test_beam_search_params_accept_numpy_integers_as_ints():
    p = BeamSearchParams(beam_width=np.int32(2), max_tokens=np.int64(3), ignore_eos=np.bool_(True))
    assert (p.beam_width, p.max_tokens, p.ignore_eos) == (2, 3, True)
    assert type(p.beam_width) is int and type(p.max_tokens) is int and type(p.ignore_eos) is bool


def test_sampling_params_integer_fields_match_beam_search_params():
    # the same rule as BeamSearchParams: numpy integers yes (stored as int), bools never
    for field in ("n", "best_of", "top_k", "seed", "max_tokens", "min_tokens", "logprobs",
                  "prompt_logprobs"):
        for flag in (True, np.bool_(True)):
            with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be"):
                SamplingParams(**{field: flag})
    p = SamplingParams(n=np.int32(2), best_of=np.int64(3), top_k=np.int64(0),
                       seed=np.uint64(5), max_tokens=np.int64(3), min_tokens=np.int8(1))
    assert (p.n, p.best_of, p.top_k, p.seed, p.max_tokens, p.min_tokens) == (2, 3, -1, 5, 3, 1)
    assert all(type(v) is int for v in (p.n, p.best_of, p.top_k, p.seed, p.max_tokens,
                                        p.min_tokens))


# --- sampler: a top_p = 1 row does not depend on its batch neighbours --------------------------
VOCAB = 32000
HEAD = 100
TAIL_P = 3.05e-8


def tail_heavy_logits() -> torch.Tensor:
    """[VOCAB] logits: 100 likely tokens, and 31900 tokens of probability 3.05e-8 each, where
    the float32 cumulative sum of the sorted probabilities reaches 1 about 2000 tokens before
    the end of the tail."""
    logits = torch.full((VOCAB,), math.log(TAIL_P))
    logits[:HEAD] = math.log((1 - TAIL_P * (VOCAB - HEAD)) / HEAD)
    return logits


def target(row, **params):
    req = Request(str(row), None, [0], SamplingParams(**params))
    return SampleTarget(row, req.seqs[0], req.params)


@pytest.mark.parametrize("neighbour", [dict(top_p=0.5), dict(top_p=0.5, top_k=5),
                                       dict(top_k=5), dict(top_p=0.9, min_p=0.1)])
def test_top_p_one_row_probabilities_do_not_depend_on_the_batch(neighbour):
    row = tail_heavy_logits()
    # The premise: a "mass above >= top_p" cut with top_p = 1 drops some of this row's tokens
    # at float32 precision.
    sorted_x, _ = torch.sort(row, descending=True)
    probs = torch.softmax(sorted_x, dim=-1)
    assert int(((torch.cumsum(probs, dim=-1) - probs) >= 1.0).sum()) > 0
    other = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    alone = Sampler._probs(row.unsqueeze(0), [target(0)])
    batched = Sampler._probs(torch.stack([row, other]), [target(0), target(1, **neighbour)])
    assert int((alone[0] > 0).sum()) == VOCAB                # nothing dropped when alone
    assert torch.equal(batched[0], alone[0])
    # and in the other order
    batched = Sampler._probs(torch.stack([other, row]), [target(0, **neighbour), target(1)])
    assert torch.equal(batched[1], alone[0])


# Seeds whose draw from tail_heavy_logits (alone in its step) is one of the tail tokens that a
# top_p = 1 cut at float32 precision would drop (found by drawing seeds 0..102399).
TAIL_SEEDS = [24218, 37484, 62093]


@pytest.mark.parametrize("seed", TAIL_SEEDS)
def test_top_p_one_row_draws_do_not_depend_on_the_batch(seed):
    row = tail_heavy_logits()
    other = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    (alone,) = Sampler([]).sample(row.unsqueeze(0), [target(0, seed=seed)])
    assert alone.token_id >= HEAD                            # a tail token, as the premise says
    results = Sampler([]).sample(torch.stack([row, other]),
                                 [target(0, seed=seed), target(1, top_p=0.5, seed=7)])
    assert results[0].token_id == alone.token_id
