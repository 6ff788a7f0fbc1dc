"""Beam search's final ranking (cum_logprob / len ** length_penalty) for every finite
length_penalty: the order of the exact scores, and no overflow or division by zero where
len ** length_penalty leaves the float range (a server request with length_penalty -600 used to
kill the engine thread with a ZeroDivisionError)."""

from __future__ import annotations

import asyncio
import random
from fractions import Fraction

import pytest

from engine_fixtures import assert_pool_clean, engine_model_dir  # noqa: F401
from pagedllm import LLM, SamplingParams
from pagedllm.engine.async_engine import AsyncLLMEngine
from pagedllm.engine.beam_search import beam_rank_key
from pagedllm.sampling_params import BeamSearchParams

EOS = {2}


def exact_order(hyps, penalty):
    """Indices of hyps best first by the exact score, in rationals (ties: input order).
    penalty: an integer, so len ** penalty is an exact rational."""
    def score(h):
        tokens, cum = h
        n = len(tokens) - (1 if tokens and tokens[-1] in EOS else 0)
        return Fraction(cum) / Fraction(max(n, 1)) ** penalty
    return sorted(range(len(hyps)), key=lambda i: -score(hyps[i]))


def ranked(hyps, penalty):
    return sorted(range(len(hyps)), key=lambda i: beam_rank_key(*hyps[i], EOS, penalty))


@pytest.mark.parametrize("penalty", [-2000, -600, -3, -1, 0, 1, 2, 5, 600, 2000])
def test_rank_is_the_exact_scores_order(penalty):
    rng = random.Random(penalty)
    hyps = []
    for _ in range(40):
        n = rng.randint(1, 12)
        tokens = [rng.randint(3, 50) for _ in range(n)]
        if rng.random() < 0.3:
            tokens[-1] = 2  # ends in EOS: not counted in the length
        cum = -rng.choice([0.0, 0.25, 1.5, 3.0, 7.75, 12.5])  # exact binary fractions
        hyps.append((tokens, cum))
    assert ranked(hyps, penalty) == exact_order(hyps, penalty)


@pytest.mark.parametrize("penalty", [1e308, -1e308, 709.0, -745.0])
def test_extreme_penalties_rank_without_raising(penalty):
    hyps = [([5, 6], -1.0), ([5, 6, 7, 8], -1.0), ([5], -0.5), ([5, 6, 7], 0.0)]
    order = ranked(hyps, penalty)
    assert order[0] == 3  # a score of 0 is the best whatever the penalty
    # With equal logprob sums, a positive penalty favours the longer beam, a negative the shorter.
    assert order.index(1) < order.index(0) if penalty > 0 else order.index(0) < order.index(1)


@pytest.mark.parametrize("penalty", [-600.0, 400.0, 1e308])
def test_offline_beam_search_with_extreme_penalties(engine_model_dir, penalty):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=200)
    params = BeamSearchParams(beam_width=2, max_tokens=6, length_penalty=penalty)
    (out,) = llm.beam_search([{"prompt_token_ids": [1, 5, 9, 12]}], params)
    assert len(out.sequences) == 2
    lens = [len(s.tokens) for s in out.sequences]
    assert all(4 < n <= 10 for n in lens)
    assert_pool_clean(llm)


def test_async_engine_survives_an_extreme_penalty(engine_model_dir):
    """The engine thread ranks the beams: an extreme penalty must neither kill it nor fail the
    request, and the next request runs."""
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=200)
    engine = AsyncLLMEngine(llm.engine)

    async def main():
        beam = BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=-600.0)
        stream = await engine.add_request("b", {"prompt_token_ids": [1, 5, 9]},
                                          SamplingParams(n=2, max_tokens=4), beam=beam, beam_n=2)
        beams = [out async for out in stream][-1]
        assert beams.finished and len(beams.outputs) == 2
        plain = await engine.add_request("p", {"prompt_token_ids": [1, 5, 9]},
                                         SamplingParams(max_tokens=3, temperature=0.0))
        last = [out async for out in plain][-1]
        assert len(last.outputs[0].token_ids) == 3

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        engine.shutdown(timeout=10)
    assert_pool_clean(llm)
