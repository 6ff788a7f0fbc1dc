"""The engine end to end on a random-weight model, with transformers as the reference."""

from __future__ import annotations

import pytest

from engine_fixtures import (assert_pool_clean, engine_model_dir, hf_greedy, hf_logprobs,  # noqa: F401
                             mixed_prompts)
from pagedllm import LLM, SamplingParams
from pagedllm.sampling_params import BeamSearchParams

NUM_REQUESTS = 34
MAX_TOKENS = 12


def tok_prompts(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


def greedy(max_tokens=MAX_TOKENS, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts(NUM_REQUESTS, seed=7)


@pytest.fixture(scope="module")
def reference(engine_model_dir, prompts):
    """transformers' greedy tokens for every prompt, run alone."""
    return [hf_greedy(engine_model_dir, p, MAX_TOKENS) for p in prompts]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_greedy_batch_equals_alone_and_transformers_under_preemption(
        engine_model_dir, prompts, reference, prefix_caching):
    # 40 blocks of 4 tokens = 160 slots for 34 requests of up to 82 tokens: constant preemption.
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=40, max_num_batched_tokens=64,
              max_num_seqs=32, enable_prefix_caching=prefix_caching, watermark=0.0)
    outs = llm.generate(tok_prompts(prompts), greedy(), use_tqdm=False)
    stats = llm.kv_cache_stats()
    assert stats["num_preemptions"] >= 10, stats
    for out, ref in zip(outs, reference):
        assert out.outputs[0].token_ids == ref
        assert out.outputs[0].finish_reason == "length"
    assert_pool_clean(llm)
    # Each request alone (roomy pool) gives the same tokens.
    alone = LLM(engine_model_dir, block_size=16, num_kv_blocks=64,
                enable_prefix_caching=prefix_caching)
    for p, ref in zip(prompts[:6], reference[:6]):
        (o,) = alone.generate(tok_prompts([p]), greedy(), use_tqdm=False)
        assert o.outputs[0].token_ids == ref
    assert_pool_clean(alone)


def test_greedy_n_samples_share_the_prompt_and_match_transformers(engine_model_dir, prompts,
                                                                  reference):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=400)
    outs = llm.generate(tok_prompts(prompts[:8]), greedy(n=3), use_tqdm=False)
    for out, ref in zip(outs, reference[:8]):
        assert len(out.outputs) == 3
        for c in out.outputs:
            assert c.token_ids == ref  # forks + copy-on-write keep every sample's K/V right
    assert llm.kv_cache_stats()["cow_copies"] > 0
    assert_pool_clean(llm)


def test_forked_samples_store_the_prompt_once(engine_model_dir):
    prompt = list(range(10, 10 + 64))  # 4 full blocks of 16
    llm = LLM(engine_model_dir, block_size=16, num_kv_blocks=64, enable_prefix_caching=False)
    peak = {}

    def watch(stats):
        peak["used"] = max(peak.get("used", 0), stats["used_blocks"])

    llm.engine.on_step = watch
    llm.generate(tok_prompts([prompt]), SamplingParams(n=4, temperature=1.0, seed=3,
                                                        max_tokens=8, ignore_eos=True),
                 use_tqdm=False)
    # Prompt: 64 tokens + 1 partial block per sample (65..72 tokens) -> 4 shared + 4 own blocks.
    assert peak["used"] <= 4 + 4, peak
    unshared = 4 * ((64 + 8 + 15) // 16)
    assert peak["used"] < unshared
    assert_pool_clean(llm)


def test_seeded_sampling_is_reproducible_and_batch_independent(engine_model_dir, prompts):
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=1234, max_tokens=10,
                            ignore_eos=True)
    target = tok_prompts([prompts[3]])
    llm = LLM(engine_model_dir, block_size=8, num_kv_blocks=200)
    (alone,) = llm.generate(target, params, use_tqdm=False)
    (again,) = llm.generate(target, params, use_tqdm=False)
    assert alone.outputs[0].token_ids == again.outputs[0].token_ids
    # In a crowd with other (unseeded and seeded) requests and a tight pool: same tokens.
    crowd = tok_prompts(prompts[:10])
    crowd_params = [SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)] * 10
    crowd_params[3] = params
    small = LLM(engine_model_dir, block_size=4, num_kv_blocks=60, max_num_batched_tokens=48, max_num_seqs=16,
                watermark=0.0)
    outs = small.generate(crowd, crowd_params, use_tqdm=False)
    assert outs[3].outputs[0].token_ids == alone.outputs[0].token_ids
    assert_pool_clean(llm)
    assert_pool_clean(small)


def test_logprobs_match_transformers(engine_model_dir, prompts):
    llm = LLM(engine_model_dir, block_size=8, num_kv_blocks=100)
    p = prompts[5]
    (out,) = llm.generate(tok_prompts([p]), greedy(max_tokens=5, logprobs=3, prompt_logprobs=2),
                          use_tqdm=False)
    c = out.outputs[0]
    ref = hf_logprobs(engine_model_dir, p + c.token_ids)
    for i, (tok, pos) in enumerate(zip(c.token_ids, c.logprobs)):
        assert pos[tok].rank == 1  # greedy
        assert abs(pos[tok].logprob - float(ref[len(p) - 1 + i, tok])) < 1e-4
        assert len(pos) <= 4
    assert out.prompt_logprobs[0] is None
    for j in range(1, len(p)):
        assert abs(out.prompt_logprobs[j][p[j]].logprob - float(ref[j - 1, p[j]])) < 1e-4
    assert c.cumulative_logprob == pytest.approx(sum(pos[t].logprob for t, pos in
                                                     zip(c.token_ids, c.logprobs)))


def test_stop_token_ids_min_tokens_and_max_model_len(engine_model_dir, prompts, reference):
    llm = LLM(engine_model_dir, block_size=8, num_kv_blocks=100, max_model_len=64)
    ref = reference[0]
    stop_at = ref[4]
    k = ref.index(stop_at)
    (out,) = llm.generate(tok_prompts([prompts[0]]),
                          greedy(stop_token_ids=[stop_at]), use_tqdm=False)
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop_at
    assert c.token_ids == ref[: k + 1]
    # min_tokens: the stop token cannot be sampled before min_tokens tokens exist.
    (out,) = llm.generate(tok_prompts([prompts[0]]),
                          greedy(stop_token_ids=[stop_at], min_tokens=k + 3), use_tqdm=False)
    c = out.outputs[0]
    assert c.token_ids[:k] == ref[:k]
    assert stop_at not in c.token_ids[: k + 3]
    assert len(c.token_ids) >= k + 3
    # max_model_len bounds prompt + max_tokens.
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        llm.generate(tok_prompts([list(range(3, 60))]), greedy(max_tokens=8), use_tqdm=False)
    # With max_tokens=None a request runs to max_model_len.
    (out,) = llm.generate(tok_prompts([list(range(3, 60))]),
                          SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True),
                          use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 64 - 57
    assert out.outputs[0].finish_reason == "length"
    assert_pool_clean(llm)


def test_request_that_can_never_fit_is_rejected_while_others_go_on(engine_model_dir, prompts,
                                                                    reference):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=30, watermark=0.0)
    eng = llm.engine
    eng.add_request("a", {"prompt_token_ids": prompts[0]}, greedy())
    eng.add_request("b", {"prompt_token_ids": prompts[1]}, greedy())
    eng.step()
    with pytest.raises(ValueError, match="exceeds max_model_len .120., the maximum context length; the KV pool .30 blocks"):
        eng.add_request("huge", {"prompt_token_ids": list(range(3, 130))}, greedy())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add_request("bad", {"prompt_token_ids": [5, 99999]}, greedy())
    # -1 was let through as if it were an Mllama image token, and its step failed a, b with it
    with pytest.raises(ValueError, match="prompt token id -1 is outside the vocabulary"):
        eng.add_request("minus-one", {"prompt_token_ids": [5, -1]}, greedy())
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.outputs[0].token_ids
    assert done == {"a": reference[0], "b": reference[1]}
    assert_pool_clean(llm)


def test_abort_frees_blocks(engine_model_dir, prompts):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=100)
    eng = llm.engine
    for i in range(4):
        eng.add_request(str(i), {"prompt_token_ids": prompts[i]}, greedy(max_tokens=50))
    eng.step()
    eng.step()
    eng.abort_request(["0", "1", "2", "3"])
    assert_pool_clean(llm)


def _reference_beam_search(path, prompt, width, max_tokens):
    """vLLM's beam search algorithm, recomputing every beam with transformers each step."""
    beams = [(prompt, 0.0)]
    done = []
    for _ in range(max_tokens):
        cands = []
        for tokens, score in beams:
            lp = hf_logprobs(path, tokens)[-1]
            vals, ids = lp.topk(2 * width)
            cands += [(tokens + [int(t)], score + float(v)) for v, t in zip(vals, ids)]
        cands.sort(key=lambda c: -c[1])
        beams = cands[:width]  # EOS is ignored in this test (ignore_eos=True)
    done = beams
    return sorted(done, key=lambda b: -b[1] / len(b[0]))


def test_beam_search_matches_reference_and_shares_blocks(engine_model_dir, prompts):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=200)
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    outs = llm.beam_search(tok_prompts(prompts[:2]), params)
    for p, out in zip(prompts[:2], outs):
        ref = _reference_beam_search(engine_model_dir, p, 3, 6)
        assert [s.tokens for s in out.sequences] == [r[0] for r in ref]
        for s, r in zip(out.sequences, ref):
            assert s.cum_logprob == pytest.approx(r[1], abs=1e-3)
    assert llm.kv_cache_stats()["cow_copies"] > 0
    assert_pool_clean(llm)


def test_prompt_logprobs_survive_chunking_and_preemption(engine_model_dir, prompts):
    # Chunks of at most 16 tokens and a pool that forces preemptions mid-prompt.
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=24, max_num_batched_tokens=16,
              max_num_seqs=8, watermark=0.0)
    chosen = [p for p in prompts if len(p) > 30][:6]
    outs = llm.generate(tok_prompts(chosen), greedy(max_tokens=6, prompt_logprobs=1),
                        use_tqdm=False)
    assert llm.kv_cache_stats()["num_preemptions"] > 0
    for p, out in zip(chosen, outs):
        ref = hf_logprobs(engine_model_dir, p)
        assert len(out.prompt_logprobs) == len(p)
        for j in range(1, len(p)):
            assert abs(out.prompt_logprobs[j][p[j]].logprob - float(ref[j - 1, p[j]])) < 1e-4
    assert_pool_clean(llm)
