"""Tensor parallelism at size 2 (two spawned ranks over gloo): greedy tokens equal the
in-process engine's and transformers', for every head layout, and through the engine's
features that move blocks (prefix caching, forks, beam search, preemption by recompute and by
swapping)."""

from __future__ import annotations

import pytest

from engine_fixtures import (assert_pool_clean, engine_model_dir, greedy, hf_greedy,  # noqa: F401
                             mixed_prompts, tok)
from pagedllm import LLM
from pagedllm.sampling_params import BeamSearchParams
from tp_fixtures import TP_MODELS, wait_gone, worker_pids, write_tp_model

pytestmark = pytest.mark.slow
MAX_TOKENS = 8


@pytest.mark.parametrize("kind", sorted(TP_MODELS))
def test_tp2_greedy_equals_tp1_and_transformers(tmp_path, kind):
    path = write_tp_model(tmp_path, kind)
    prompts = mixed_prompts(5, seed=11, hi=40, vocab=500)
    reference = [hf_greedy(path, p, MAX_TOKENS) for p in prompts]
    one = LLM(path, block_size=8, num_kv_blocks=64, num_threads=1)
    tp1 = [o.outputs[0].token_ids for o in one.generate(tok(prompts), greedy(MAX_TOKENS))]
    llm = LLM(path, block_size=8, num_kv_blocks=64, num_threads=1, tensor_parallel_size=2)
    pids = worker_pids(llm)
    assert len(pids) == 2
    tp2 = [o.outputs[0].token_ids for o in llm.generate(tok(prompts), greedy(MAX_TOKENS))]
    assert tp2 == tp1 == reference
    assert "x2 (tensor parallel, mp)" in llm.kv_cache_stats()["device"]
    assert_pool_clean(llm)
    llm.engine.shutdown()
    assert wait_gone(pids) == []


@pytest.fixture(scope="module")
def tight_tp2(engine_model_dir):
    """A TP=2 engine on a pool small enough to preempt (40 blocks of 4 tokens)."""
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=40, max_num_batched_tokens=64,
              max_num_seqs=32, watermark=0.0, num_threads=1, tensor_parallel_size=2)
    yield llm
    llm.engine.shutdown()


def test_tp2_prefix_caching_and_preemption_by_recompute(tight_tp2, engine_model_dir):
    prefix = mixed_prompts(1, seed=5, lo=24, hi=24)[0]
    prompts = [prefix + p for p in mixed_prompts(12, seed=6, hi=40)]
    reference = [hf_greedy(engine_model_dir, p, MAX_TOKENS) for p in prompts]
    outs = tight_tp2.generate(tok(prompts), greedy(MAX_TOKENS))
    stats = tight_tp2.kv_cache_stats()
    assert stats["num_preemptions"] > 0, stats
    assert stats["prefix_cache_hit_rate"] > 0, stats
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert_pool_clean(tight_tp2)


def test_tp2_forks_n3_and_beam_search_equal_tp1(tight_tp2, engine_model_dir):
    prompts = mixed_prompts(3, seed=8, hi=20)
    one = LLM(engine_model_dir, block_size=4, num_kv_blocks=40, max_num_batched_tokens=64,
              max_num_seqs=32, watermark=0.0, num_threads=1)
    outs = tight_tp2.generate(tok(prompts), greedy(MAX_TOKENS, n=3))
    for out, p in zip(outs, prompts):
        ref = hf_greedy(engine_model_dir, p, MAX_TOKENS)
        assert [c.token_ids for c in out.outputs] == [ref] * 3
    params = BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True)
    got = tight_tp2.beam_search(tok(prompts[:2]), params)
    want = one.beam_search(tok(prompts[:2]), params)
    for g, w in zip(got, want):
        assert [s.tokens for s in g.sequences] == [s.tokens for s in w.sequences]
        for gs, ws in zip(g.sequences, w.sequences):
            assert gs.cum_logprob == pytest.approx(ws.cum_logprob, abs=1e-4)
    assert tight_tp2.kv_cache_stats()["cow_copies"] > 0
    assert_pool_clean(tight_tp2)


def test_tp2_preemption_by_swapping(engine_model_dir):
    prompts = mixed_prompts(16, seed=9, hi=50)
    reference = [hf_greedy(engine_model_dir, p, MAX_TOKENS) for p in prompts]
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=40, max_num_batched_tokens=64,
              max_num_seqs=32, watermark=0.0, num_threads=1, tensor_parallel_size=2,
              preemption_mode="swap", swap_space=0.01)
    outs = llm.generate(tok(prompts), greedy(MAX_TOKENS))
    stats = llm.kv_cache_stats()
    assert stats["num_swap_outs"] > 0 and stats["num_swap_ins"] == stats["num_swap_outs"], stats
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert_pool_clean(llm)
    llm.engine.shutdown()
