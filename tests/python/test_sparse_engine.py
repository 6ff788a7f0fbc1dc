"""The engine with block-sparse decode attention: all blocks through the sparse kernels equals
dense exactly, per-request overrides, forks, read-vs-held counters, clean errors and no leaked
blocks (tiny random model; quality against dense is measured in benchmarks/bench_sparse.py)."""

from __future__ import annotations

import pytest

from engine_fixtures import engine_model_dir, mixed_prompts  # noqa: F401 (fixture)
from pagedllm import LLM, SamplingParams

GREEDY = dict(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)


def _run(llm, prompts, **params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(**{**GREEDY, **params}), use_tqdm=False)
    return [o.outputs[0] for o in outs]


def _llm(path, **kw):
    return LLM(path, block_size=4, num_kv_blocks=400, **kw)


def _assert_no_leak(llm):
    stats = llm.kv_cache_stats()
    assert stats["used_blocks"] == 0, stats


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts(4, seed=3, lo=20, hi=60)


@pytest.fixture(scope="module")
def dense_outputs(engine_model_dir, prompts):  # noqa: F811
    return _run(_llm(engine_model_dir), prompts)


@pytest.mark.parametrize("cfg", [{"strategy": "dilated", "stride": 1},
                                 {"strategy": "quest", "token_budget": 4096}])
def test_all_blocks_through_the_sparse_kernels_equals_dense(engine_model_dir, prompts,  # noqa: F811
                                                            dense_outputs, cfg):
    llm = _llm(engine_model_dir, sparse_attention=cfg)
    llm.engine.scheduler.sparse.force_plan = True
    outs = _run(llm, prompts)
    for got, want in zip(outs, dense_outputs):
        assert got.token_ids == want.token_ids
        assert got.logprobs == want.logprobs  # the same kernels' arithmetic: bit for bit
    stats = llm.kv_cache_stats()
    assert stats["sparse_blocks_read_total"] == stats["sparse_blocks_held_total"] > 0
    _assert_no_leak(llm)


@pytest.mark.parametrize("strategy", ["fixed_pattern", "dilated", "random", "quest",
                                      "streaming"])
def test_each_strategy_runs_and_reads_fewer_blocks(engine_model_dir, prompts, strategy):  # noqa: F811
    llm = _llm(engine_model_dir, sparse_attention={"strategy": strategy, "local_blocks": 2,
                                                   "stride": 4, "density": 0.2,
                                                   "token_budget": 16})
    outs = _run(llm, prompts)
    assert all(len(o.token_ids) == GREEDY["max_tokens"] for o in outs)
    stats = llm.kv_cache_stats()
    if strategy == "streaming":  # it frees what it skips: it reads every block it still holds
        assert stats["sparse_blocks_dropped"] > 0
        assert stats["sparse_blocks_read_total"] == stats["sparse_blocks_held_total"] > 0
    else:
        assert 0 < stats["sparse_blocks_read_total"] < stats["sparse_blocks_held_total"]
        assert stats["sparse_read_fraction"] < 0.7
    _assert_no_leak(llm)


def test_per_request_override(engine_model_dir, prompts, dense_outputs):  # noqa: F811
    cfg = {"strategy": "fixed_pattern", "local_blocks": 2}
    sparse_default = _run(_llm(engine_model_dir, sparse_attention=cfg), prompts[:1])[0]
    llm = _llm(engine_model_dir)  # dense default
    reqs = [{"prompt_token_ids": p} for p in prompts[:2]]
    outs = llm.generate(reqs, [SamplingParams(**GREEDY, sparse_attention=cfg),
                               SamplingParams(**GREEDY)], use_tqdm=False)
    assert outs[0].outputs[0].token_ids == sparse_default.token_ids
    assert outs[1].outputs[0].token_ids == dense_outputs[1].token_ids
    # and the other way: a sparse default turned off per request
    llm2 = _llm(engine_model_dir, sparse_attention=cfg)
    off = _run(llm2, prompts[1:2], sparse_attention={"strategy": "dense"})[0]
    assert off.token_ids == dense_outputs[1].token_ids
    _assert_no_leak(llm)
    _assert_no_leak(llm2)
    # a dense engine asks per row only while a request with its own config is alive
    sched = llm.engine.scheduler
    assert not sched.sparse.maybe_sparse
    llm.engine.add_request("own", {"prompt_token_ids": prompts[0]},
                           SamplingParams(**GREEDY, sparse_attention=cfg))
    llm.engine.add_request("gone", {"prompt_token_ids": prompts[1]},
                           SamplingParams(**GREEDY, sparse_attention=cfg))
    assert sched.sparse.maybe_sparse
    llm.engine.abort_request("gone")
    llm.engine.step()
    assert sched.sparse.maybe_sparse
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert not sched.sparse.maybe_sparse


def test_forks_share_and_free(engine_model_dir, prompts):  # noqa: F811
    llm = _llm(engine_model_dir, sparse_attention={"strategy": "quest", "token_budget": 16,
                                                   "local_blocks": 2})
    outs = llm.generate([{"prompt_token_ids": prompts[0]}],
                        SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=20,
                                       ignore_eos=True), use_tqdm=False)
    assert len(outs[0].outputs) == 3
    _assert_no_leak(llm)


@pytest.mark.parametrize("strategy", ["quest", "streaming", "fixed_pattern"])
def test_beam_search_forks_share_and_free(engine_model_dir, prompts, strategy):  # noqa: F811
    from pagedllm.sampling_params import BeamSearchParams

    llm = _llm(engine_model_dir, sparse_attention={"strategy": strategy, "token_budget": 16,
                                                   "local_blocks": 2})
    outs = llm.beam_search([{"prompt_token_ids": prompts[0]}],
                           BeamSearchParams(beam_width=3, max_tokens=30, ignore_eos=True))
    assert len(outs[0].sequences) == 3
    stats = llm.kv_cache_stats()
    assert stats["sparse_blocks_read_total"] > 0
    _assert_no_leak(llm)


def test_quest_per_request_without_bounds_is_a_clean_error(engine_model_dir, prompts):  # noqa: F811
    llm = _llm(engine_model_dir)
    with pytest.raises(ValueError, match="needs the per-block key bounds"):
        llm.generate([{"prompt_token_ids": prompts[0]}],
                     SamplingParams(sparse_attention={"strategy": "quest"}), use_tqdm=False)
    outs = _run(llm, prompts[:1])  # the engine carries on
    assert len(outs[0].token_ids) == GREEDY["max_tokens"]
    _assert_no_leak(llm)


def test_bad_engine_config_is_a_clean_error(engine_model_dir):  # noqa: F811
    with pytest.raises(ValueError, match=r"sparse_attention.stride: expected an integer >= 1"):
        _llm(engine_model_dir, sparse_attention={"strategy": "dilated", "stride": 0})
    with pytest.raises(ValueError, match=r"token_budget = 4 is below"):
        _llm(engine_model_dir, sparse_attention={"strategy": "quest", "token_budget": 4})


QUEST = {"strategy": "quest", "token_budget": 32, "local_blocks": 2}


def test_quest_bounds_travel_with_swapped_blocks(engine_model_dir):  # noqa: F811
    """Preemption by swapping moves whole block regions, key bounds included: a tight pool
    that swaps gives the tokens of an ample one."""
    prompts = mixed_prompts(12, seed=2, lo=20, hi=60)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    reqs = [{"prompt_token_ids": p} for p in prompts]
    ample = LLM(engine_model_dir, block_size=4, num_kv_blocks=600, sparse_attention=QUEST)
    want = [o.outputs[0].token_ids for o in ample.generate(reqs, params, use_tqdm=False)]
    tight = LLM(engine_model_dir, block_size=4, num_kv_blocks=70, max_num_seqs=12,
                watermark=0.0, preemption_mode="swap", swap_space=0.01, sparse_attention=QUEST)
    got = [o.outputs[0].token_ids for o in tight.generate(reqs, params, use_tqdm=False)]
    stats = tight.kv_cache_stats()
    assert stats["num_swap_outs"] > 0 and stats["num_swap_ins"] == stats["num_swap_outs"], stats
    assert got == want
    _assert_no_leak(tight)


def test_quest_with_prefix_cache_hits(engine_model_dir, prompts):  # noqa: F811
    """A prompt served from the prefix cache (its full blocks, bounds included, reused) decodes
    as it did the first time."""
    llm = _llm(engine_model_dir, sparse_attention=QUEST)
    first = _run(llm, prompts[:1])[0]
    before = llm.kv_cache_stats()["prefix_cache_hits"]
    again = _run(llm, prompts[:1])[0]
    assert llm.kv_cache_stats()["prefix_cache_hits"] - before >= 16
    assert again.token_ids == first.token_ids
    _assert_no_leak(llm)


def test_quest_bounds_travel_through_the_persistent_tier(engine_model_dir, tmp_path):  # noqa: F811
    """Prompt blocks read back from disk after a restart carry their key bounds: the restarted
    engine decodes as the one that computed them."""
    prompts = mixed_prompts(3, seed=21, lo=48, hi=80)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reqs = [{"prompt_token_ids": p} for p in prompts]

    def engine():
        return LLM(engine_model_dir, block_size=8, num_kv_blocks=256, sparse_attention=QUEST,
                   persistence={"storage_path": str(tmp_path / "kv")})

    cold = engine()
    want = [o.outputs[0].token_ids for o in cold.generate(reqs, params, use_tqdm=False)]
    cold.engine.tier.flush()
    assert cold.kv_cache_stats()["disk_records"] > 0
    cold.engine.shutdown()
    warm = engine()
    got = [o.outputs[0].token_ids for o in warm.generate(reqs, params, use_tqdm=False)]
    assert warm.kv_cache_stats()["disk_hit_tokens"] >= 8 * len(prompts)
    assert got == want
    _assert_no_leak(warm)
    warm.engine.shutdown()


@pytest.mark.parametrize("cfg", [{"strategy": "fixed_pattern", "sink_blocks": 1,
                                  "local_blocks": 1},
                                 {"strategy": "quest", "token_budget": 24, "local_blocks": 2}])
def test_sparse_decoded_blocks_are_not_served_to_dense_requests(engine_model_dir, prompts,  # noqa: F811
                                                               cfg):
    """K/V that sparse decode computed are approximate: a later dense request whose prompt runs
    through them (a chat follow-up on the sparse answer) must compute its own, as a fresh engine
    does (they were served from the prefix cache, and the outputs differed)."""
    engine_cfg = {"strategy": "quest"} if cfg["strategy"] == "quest" else None
    llm = _llm(engine_model_dir, sparse_attention=engine_cfg)
    first = _run(llm, prompts[:1], max_tokens=40, sparse_attention=cfg)[0]
    follow_up = prompts[0] + first.token_ids[:36] + [5, 6, 7]
    got = _run(llm, [follow_up], sparse_attention={"strategy": "dense"})[0]
    want = _run(_llm(engine_model_dir, sparse_attention=engine_cfg), [follow_up],
                sparse_attention={"strategy": "dense"})[0]
    assert got.token_ids == want.token_ids
    assert got.logprobs == want.logprobs
    stats = llm.kv_cache_stats()
    # The prompt's own (densely prefilled) blocks are still shared.
    assert stats["prefix_cache_hits"] >= (len(prompts[0]) // 4) * 4, stats
    assert stats["prefix_cache_hits"] < len(prompts[0]) + 4, stats
    _assert_no_leak(llm)


def test_sparse_settings_that_read_every_block_keep_caching(engine_model_dir, prompts):  # noqa: F811
    """A sequence whose plan reads all it holds computes exact K/V: its blocks stay shareable."""
    llm = _llm(engine_model_dir)
    first = _run(llm, prompts[:1], max_tokens=40,
                 sparse_attention={"strategy": "fixed_pattern", "local_blocks": 1000})[0]
    follow_up = prompts[0] + first.token_ids[:36] + [5, 6, 7]
    _run(llm, [follow_up])
    assert llm.kv_cache_stats()["prefix_cache_hits"] >= len(prompts[0]) + 32
    _assert_no_leak(llm)


def test_swapped_sparse_sequences_stay_out_of_the_prefix_cache(engine_model_dir):  # noqa: F811
    """Swap-in re-admits a sequence block by block: a sequence holding sparse-decoded K/V must
    come back with its blocks kept out of the prefix cache, at every step; outputs still equal
    an ample pool's (swapping moves the sparse K/V as they are)."""
    cfg = {"strategy": "fixed_pattern", "sink_blocks": 1, "local_blocks": 1}
    prompts = mixed_prompts(12, seed=2, lo=20, hi=60)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ample = _llm(engine_model_dir, sparse_attention=cfg)
    want = [o.outputs[0].token_ids for o in ample.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    tight = LLM(engine_model_dir, block_size=4, num_kv_blocks=70, max_num_seqs=12,
                watermark=0.0, preemption_mode="swap", swap_space=0.01, sparse_attention=cfg)
    eng, sched = tight.engine, tight.engine.scheduler
    for i, p in enumerate(prompts):
        eng.add_request(str(i), {"prompt_token_ids": p}, params)
    got, swapped_back = {}, 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                got[out.request_id] = out.outputs[0].token_ids
        for s in sched.running:
            if s.sparse_kv:
                assert not sched.kv.caching(s.seq_id), s.seq_id
                swapped_back += s.num_preemptions > 0
    assert sched.num_swap_ins > 0 and swapped_back > 0
    assert [got[str(i)] for i in range(len(prompts))] == want
    _assert_no_leak(tight)
