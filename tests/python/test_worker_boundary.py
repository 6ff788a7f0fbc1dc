"""The worker boundary: swap preemption, the KV transfer plan, failure isolation, beams under
pressure and the new engine options (device, dtype, preemption_mode, swap_space)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine_fixtures import (assert_pool_clean, engine_model_dir, hf_greedy,  # noqa: F401
                             mixed_prompts, tok)
from engine_fixtures import greedy as greedy_params
from pagedllm import LLM, SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.engine.kv_transfer import KVTransferEngine
from pagedllm.engine.transfer_plan import KVTransferPlan, as_pairs
from pagedllm.model import ModelConfig, PagedKVCache
from pagedllm.sampling_params import BeamSearchParams

MAX_TOKENS = 12




def greedy(max_tokens=MAX_TOKENS, **kw):
    return greedy_params(max_tokens, **kw)


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts(24, seed=11)


@pytest.fixture(scope="module")
def reference(engine_model_dir, prompts):
    return [hf_greedy(engine_model_dir, p, MAX_TOKENS) for p in prompts]


def assert_host_clean(llm):
    s = llm.kv_cache_stats()
    assert s["num_swapped_seqs"] == 0, s
    assert s["host_free_blocks"] == s["host_blocks"], s


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_swap_preemption_matches_alone_and_transformers(engine_model_dir, prompts, reference,
                                                        prefix_caching):
    # 22 blocks of 4 tokens for 24 requests of up to 82 tokens: half of them are swapped out.
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=22, max_num_batched_tokens=64,
              max_num_seqs=24, enable_prefix_caching=prefix_caching, watermark=0.0,
              preemption_mode="swap", swap_space=0.01)
    outs = llm.generate(tok(prompts), greedy(), use_tqdm=False)
    stats = llm.kv_cache_stats()
    assert stats["num_swap_outs"] >= 12 and stats["num_swap_ins"] == stats["num_swap_outs"], stats
    for out, ref in zip(outs, reference):
        assert out.outputs[0].token_ids == ref
    assert_pool_clean(llm)
    assert_host_clean(llm)
    # The same requests preempted by recompute, and alone: the same tokens and logprobs.
    params = greedy(logprobs=1)
    swapped = llm.generate(tok(prompts[:8]), params, use_tqdm=False)
    alone = LLM(engine_model_dir, block_size=4, num_kv_blocks=256,
                enable_prefix_caching=prefix_caching)
    for p, s in zip(prompts[:8], swapped):
        (a,) = alone.generate(tok([p]), params, use_tqdm=False)
        assert a.outputs[0].token_ids == s.outputs[0].token_ids
        for pa, ps in zip(a.outputs[0].logprobs, s.outputs[0].logprobs):
            (ta, la), = [(t, lp.logprob) for t, lp in pa.items() if lp.rank == 1]
            assert ps[ta].logprob == pytest.approx(la, abs=1e-4)


def test_swap_falls_back_to_recompute_when_the_host_pool_is_full(engine_model_dir, prompts,
                                                                  reference):
    # swap_space for 6 host blocks: most victims cannot be swapped and are recomputed.
    bpb = PagedKVCache.bytes_per_block(ModelConfig.from_dir(engine_model_dir), 4)
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=22, max_num_batched_tokens=64,
              max_num_seqs=24, watermark=0.0, preemption_mode="swap",
              swap_space=6.5 * bpb / (1 << 30))
    outs = llm.generate(tok(prompts), greedy(), use_tqdm=False)
    s = llm.kv_cache_stats()
    assert s["host_blocks"] == 6
    assert s["num_preemptions"] > s["num_swap_outs"] > 0, s
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert_pool_clean(llm)
    assert_host_clean(llm)


def test_no_leak_after_mixed_run_with_aborts(engine_model_dir, prompts):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=40, max_num_batched_tokens=48,
              max_num_seqs=32, watermark=0.0, preemption_mode="swap", swap_space=0.01)
    eng = llm.engine
    rng = random.Random(3)
    live = []
    for i, p in enumerate(prompts * 2):
        params = (SamplingParams(temperature=0.9, n=2, max_tokens=10, seed=i) if i % 3 == 0
                  else greedy(max_tokens=rng.randint(1, 14)))
        live.append(eng.add_request(f"r{i}", {"prompt_token_ids": p}, params))
        for _ in range(rng.randint(0, 3)):
            eng.step()
        if rng.random() < 0.3 and live:
            eng.abort_request(live.pop(rng.randrange(len(live))))
    while eng.has_unfinished_requests():
        eng.step()
    s = llm.kv_cache_stats()
    assert s["num_swap_outs"] > 0, s
    assert_pool_clean(llm)
    assert_host_clean(llm)


def test_transfer_engine_order_overlap_and_tier_hooks(engine_model_dir):
    cfg = ModelConfig.from_dir(engine_model_dir)
    kv = PagedKVCache(cfg, 8, 4)
    kv.pool.copy_(torch.arange(kv.pool.numel(), dtype=torch.float32).view(kv.pool.shape))
    from pagedllm.engine.host_swap import HostSwapPool

    host = HostSwapPool(kv.pool, 4)
    loaded, stored = {}, {}
    blob = torch.full(kv.pool.shape[1:], 7.0)

    def source(key, block):
        loaded[key] = True
        block.copy_(blob)

    def sink(block, key):
        stored[key] = block.clone()

    t = KVTransferEngine(kv, host, source=source, sink=sink)
    t.record_events = True
    before = kv.pool.clone()
    # Swap out block 5 while the forward writes block 1: no conflict, it overlaps.
    plan = KVTransferPlan(swap_out=as_pairs([(5, 0)]), copies=as_pairs([(2, 3)]),
                          loads=[(b"k", 6)], stores=[(2, b"s")])
    t.before_forward(plan, np.array([1]))
    assert torch.equal(kv.pool[3], before[2]) and torch.equal(kv.pool[6], blob)
    kv.pool[2].fill_(-1.0)  # "the forward" writes block 2, which the store must see
    t.after_forward(plan)
    t.join()
    assert torch.equal(host.pool[0], before[5]) and loaded == {b"k": True}
    assert torch.equal(stored[b"s"], kv.pool[2])
    # A swap-out of a block this step writes runs before the forward, not beside it.
    t.before_forward(KVTransferPlan(swap_out=as_pairs([(1, 1)])), np.array([1, 4]))
    assert [e[0] for e in t.events] == ["swap_out_async", "load", "copy", "store", "swap_out"]
    assert t.num_overlapped_swap_outs == 1
    with pytest.raises(RuntimeError, match="no host swap pool"):
        KVTransferEngine(kv).before_forward(KVTransferPlan(swap_in=as_pairs([(0, 1)])),
                                            np.array([], np.int64))
    t.shutdown()


def test_a_failing_draw_fails_only_its_request(engine_model_dir, prompts, reference):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=200)
    eng = llm.engine
    real = eng.sampler.sample

    def flaky(logits, targets):
        if any(t.seq.request.request_id == "bad" for t in targets):
            raise OverflowError("made-up sampler failure")
        return real(logits, targets)

    eng.sampler.sample = flaky
    eng.add_request("bad", {"prompt_token_ids": prompts[0]}, greedy())
    for i, p in enumerate(prompts[1:5]):
        eng.add_request(f"ok{i}", {"prompt_token_ids": p}, greedy())
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    assert done["bad"].outputs[0].finish_reason == "error"
    assert "made-up sampler failure" in done["bad"].error
    for i in range(4):
        assert done[f"ok{i}"].outputs[0].token_ids == reference[i + 1]
    assert_pool_clean(llm)
    # The engine goes on serving.
    (o,) = llm.generate(tok(prompts[:1]), greedy(), use_tqdm=False)
    assert o.outputs[0].token_ids == reference[0]


def test_a_failing_forward_fails_its_step_not_the_engine(engine_model_dir, prompts, reference):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=200)
    eng = llm.engine
    worker = eng.executor.worker
    real = worker.model_runner.execute
    calls = {"n": 0}

    def broken(out):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("made-up kernel failure")
        return real(out)

    worker.model_runner.execute = broken
    eng.add_request("a", {"prompt_token_ids": prompts[0]}, greedy())
    outs = eng.step()
    assert [o.request_id for o in outs] == ["a"] and outs[0].error.endswith("kernel failure")
    assert_pool_clean(llm)
    (o,) = llm.generate(tok(prompts[:1]), greedy(), use_tqdm=False)
    assert o.outputs[0].token_ids == reference[0]


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_beam_search_finishes_in_a_pool_that_holds_one_beam(engine_model_dir, width, mode):
    prompt = mixed_prompts(1, seed=5, lo=100, hi=100)[0]
    llm = LLM(engine_model_dir, block_size=16, num_kv_blocks=16, watermark=0.0,
              preemption_mode=mode, swap_space=0.01)
    (out,) = llm.beam_search(tok([prompt]), BeamSearchParams(beam_width=width, max_tokens=16,
                                                             ignore_eos=True))
    assert len(out.sequences) == width
    assert all(len(s.tokens) == 116 for s in out.sequences)
    assert_pool_clean(llm)
    # The same search in a roomy pool ranks the same beams.
    roomy = LLM(engine_model_dir, block_size=16, num_kv_blocks=400)
    (ref,) = roomy.beam_search(tok([prompt]), BeamSearchParams(beam_width=width, max_tokens=16,
                                                               ignore_eos=True))
    assert [s.tokens for s in out.sequences] == [s.tokens for s in ref.sequences]


def test_n_samples_finish_in_a_pool_that_holds_few_of_them(engine_model_dir):
    # 8 samples of a 120-token prompt, 30 tokens each, in 10 blocks of 16: they cannot all run
    # at once; preempted forks are recomputed one by one and every sample finishes.
    llm = LLM(engine_model_dir, block_size=16, num_kv_blocks=10, watermark=0.0)
    prompt = mixed_prompts(1, seed=2, lo=120, hi=120)[0]
    (out,) = llm.generate(tok([prompt]), SamplingParams(n=8, temperature=1.0, max_tokens=30,
                                                        seed=0), use_tqdm=False)
    assert out.error is None and len(out.outputs) == 8
    assert all(c.finish_reason == "length" and len(c.token_ids) == 30 for c in out.outputs)
    assert llm.kv_cache_stats()["num_preemptions"] > 0
    assert_pool_clean(llm)


@pytest.mark.parametrize("field,value,msg", [
    ("device", "tpu", "device must be one of auto, cpu, cuda, cuda:N"),
    ("dtype", "float64", "dtype must be one of auto, float32, bfloat16, float16"),
    ("swap_space", -1, "swap_space must be a number of GiB in [0, 1024]"),
    ("preemption_mode", "discard", "preemption_mode must be one of recompute, swap"),
    ("gpu_memory_utilization", 1.5, "gpu_memory_utilization must be a fraction in (0, 1]"),
])
def test_bad_values_of_the_new_options(field, value, msg):
    with pytest.raises(ValueError) as e:
        EngineConfig(**{field: value})
    assert str(e.value).startswith(msg) and "\n" not in str(e.value)


def test_yaml_sections_carry_the_new_options(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kv_cache:\n  swap_space: 0.5\nscheduler:\n  preemption_mode: swap\n"
                    "runtime:\n  device: cpu\n  dtype: bfloat16\n")
    cfg = EngineConfig.from_yaml(str(path))
    assert (cfg.swap_space, cfg.preemption_mode, cfg.device, cfg.dtype) == (
        0.5, "swap", "cpu", "bfloat16")


def test_cuda_without_a_gpu_is_a_clear_error(engine_model_dir):
    from pagedllm import ops

    if ops.cuda_available() and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match=r"^device: device 'cuda' was requested but .*"
                                         r"use device='cpu'$"):
        LLM(engine_model_dir, device="cuda")


def test_swap_space_too_small_for_a_block(engine_model_dir):
    with pytest.raises(ValueError, match="swap_space=1e-09 GiB holds no KV block"):
        LLM(engine_model_dir, preemption_mode="swap", swap_space=1e-9)


def test_cpu_bfloat16_engine_runs(engine_model_dir, prompts, reference):
    llm = LLM(engine_model_dir, dtype="bfloat16", block_size=4, num_kv_blocks=200)
    assert llm.kv_cache_stats()["device"] == "cpu, bfloat16"
    outs = llm.generate(tok(prompts[:6]), greedy(), use_tqdm=False)
    # bf16 agrees with the fp32 reference statistically, not token for token.
    first = [o.outputs[0].token_ids[0] == r[0] for o, r in zip(outs, reference[:6])]
    assert sum(first) >= 4
    assert_pool_clean(llm)
    with pytest.raises(ValueError, match="float16' is not supported on the CPU"):
        LLM(engine_model_dir, dtype="float16", device="cpu")


def test_copy_waves_keep_the_order_of_dependent_copies():
    from pagedllm.engine.transfer_plan import copy_waves

    pairs = as_pairs([(9, 4), (1, 2), (5, 9), (3, 6), (7, 6)])
    waves = copy_waves(pairs)
    assert [w.tolist() for w in waves] == [[[9, 4], [1, 2]], [[5, 9], [3, 6]], [[7, 6]]]
    # Running the waves equals running the pairs one by one.
    pool = torch.arange(10.0).view(10, 1).repeat(1, 3)
    one_by_one = pool.clone()
    for s, d in pairs.tolist():
        one_by_one[d] = one_by_one[s]
    from pagedllm import ops

    for w in waves:
        ops.copy_blocks([pool], torch.from_numpy(w))
    assert torch.equal(pool, one_by_one)
    assert copy_waves(as_pairs([])) == []


def test_attention_metadata_checks_the_host_copy_it_is_given():
    from pagedllm.model import AttentionMetadata

    args = dict(slot_mapping=torch.arange(3), block_tables=torch.zeros((2, 1), dtype=torch.int32),
                context_lens=torch.tensor([1, 2], dtype=torch.int32),
                cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32), num_decode_seqs=1)
    AttentionMetadata(**args, cu_seqlens_q_host=np.array([0, 1, 3], np.int32))
    # The host copy is what the values are read from (a device tensor is never read).
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        AttentionMetadata(**args, cu_seqlens_q_host=np.array([0, 2, 3], np.int32))
