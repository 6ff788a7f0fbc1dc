"""Mllama through the engine against transformers' MllamaForConditionalGeneration on a tiny
random checkpoint (made here, nothing downloaded): greedy tokens identical and log-probs close
with 0, 1 and 2 images (consecutive and apart), batched with text-only requests, under
preemption, with n > 1 and beam search; the cross K/V in their own pool, shared by forks and
freed with the requests.
"""

from __future__ import annotations

import pytest
import torch

from mllama_fixtures import (IMAGE_TOKEN, assert_pools_clean, hf_greedy,
                             hf_logprobs, random_image, text_prompt, write_test_checkpoint)
from pagedllm import LLM, SamplingParams

MAX_TOKENS = 6
IMG = IMAGE_TOKEN


@pytest.fixture(scope="module")
def mllama_dir(tmp_path_factory) -> str:
    return write_test_checkpoint(str(tmp_path_factory.mktemp("mllama")))


def greedy(**kw):
    return SamplingParams(temperature=0.0, max_tokens=kw.pop("max_tokens", MAX_TOKENS),
                          ignore_eos=True, **kw)


def cases():
    """(prompt ids, images): 0, 1 and 2 images (consecutive, apart), 1 and 2 tiles each."""
    wide, square = random_image(1, (40, 20)), random_image(2, (14, 14))
    tall = random_image(3, (18, 37))
    return [
        (text_prompt(9, 0), []),
        ([IMG] + text_prompt(6, 1), [wide]),
        ([IMG, IMG] + text_prompt(5, 2), [square, tall]),
        ([IMG] + text_prompt(3, 3) + [IMG] + text_prompt(3, 4), [tall, wide]),
        (text_prompt(14, 5), []),
        ([IMG] + text_prompt(2, 6), [square]),
    ]


def as_prompts(cs):
    return [{"prompt_token_ids": p, "multi_modal_data": {"image": ims}} if ims
            else {"prompt_token_ids": p} for p, ims in cs]


def make_llm(path, **kw):
    kw.setdefault("num_kv_blocks", 128)
    kw.setdefault("num_cross_kv_blocks", 64)
    return LLM(path, block_size=4, **kw)


def test_greedy_matches_transformers_batched_with_text(mllama_dir):
    cs = cases()
    llm = make_llm(mllama_dir)
    outs = llm.generate(as_prompts(cs), greedy(logprobs=1), use_tqdm=False)
    for (p, ims), out in zip(cs, outs):
        c = out.outputs[0]
        want, ref = hf_greedy(mllama_dir, p, ims, MAX_TOKENS)
        assert c.token_ids == want, (p, len(ims))
        for i, (tok, lp) in enumerate(zip(c.token_ids, c.logprobs)):
            assert abs(lp[tok].logprob - float(ref[i, tok])) < 1e-4
    # the prompt is not expanded: images live in cross blocks, not prompt positions
    assert len(outs[1].prompt_token_ids) == len(cs[1][0])
    # each distinct image encoded once (tall and wide appear twice in the batch)
    assert llm.engine.images.cross.encoder.num_encoded_images == 3
    assert_pools_clean(llm)


def test_images_change_the_output(mllama_dir):
    # the reference would not see a broken cross path if the images did not matter
    p, ims = cases()[1]
    llm = make_llm(mllama_dir)
    a = llm.generate(as_prompts([(p, ims)]), greedy(logprobs=1), use_tqdm=False)[0]
    b = llm.generate(as_prompts([(p, [random_image(9, (40, 20))])]), greedy(logprobs=1),
                     use_tqdm=False)[0]
    la = a.outputs[0].logprobs[0][a.outputs[0].token_ids[0]].logprob
    lb = b.outputs[0].logprobs[0][b.outputs[0].token_ids[0]].logprob
    assert a.outputs[0].token_ids != b.outputs[0].token_ids or abs(la - lb) > 1e-3


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_recomputes_cross_kv(mllama_dir, mode):
    # 14 self blocks of 4 tokens cannot hold the batch: sequences are preempted; those with
    # cross K/V are recomputed (never swapped) and their cross blocks rewritten.
    cs = cases()
    llm = make_llm(mllama_dir, num_kv_blocks=14, max_num_seqs=4, max_num_batched_tokens=8,
                   preemption_mode=mode, swap_space=0.01, watermark=0.0)
    outs = llm.generate(as_prompts(cs), greedy(max_tokens=10), use_tqdm=False)
    for (p, ims), out in zip(cs, outs):
        assert out.outputs[0].token_ids == hf_greedy(mllama_dir, p, ims, 10)[0], (mode, p)
    assert llm.engine.scheduler.num_preemptions > 0
    # the encoder ran once per distinct image: rewrites after preemption read the cache
    assert llm.engine.images.cross.encoder.num_encoded_images == 3
    assert_pools_clean(llm)


def test_cross_pool_pressure_waits_instead_of_failing(mllama_dir):
    # The cross pool holds one 2-tile image request at a time: the others wait their turn.
    from pagedllm.multimodal.limits import MultiModalLimits
    from pagedllm.multimodal.mllama_prompt import MllamaPromptProcessor

    p, ims = cases()[1]
    proc = MllamaPromptProcessor.from_dir(mllama_dir, MultiModalLimits(), 4)
    need = -(-sum(im.num_cross_tokens for im in proc.process(p, ims).cross_images) // 4)
    llm = make_llm(mllama_dir, num_cross_kv_blocks=need)
    prompts = as_prompts([(p, ims)] * 3 + [cases()[0]])
    outs = llm.generate(prompts, greedy(), use_tqdm=False)
    want = hf_greedy(mllama_dir, p, ims, MAX_TOKENS)[0]
    assert [o.outputs[0].token_ids for o in outs[:3]] == [want] * 3
    assert_pools_clean(llm)


def test_n_greater_than_one_shares_the_cross_blocks(mllama_dir):
    p, ims = cases()[3]
    llm = make_llm(mllama_dir)
    eng = llm.engine
    eng.add_request("r", as_prompts([(p, ims)])[0], greedy(n=3))
    used = []
    while eng.has_unfinished_requests():
        outs = eng.step()
        used.append(eng.images.cross.kv.num_blocks - eng.images.cross.kv.num_free_blocks)
    ref = hf_greedy(mllama_dir, p, ims, MAX_TOKENS)[0]
    assert [c.token_ids for c in outs[0].outputs] == [ref] * 3
    need = eng.images.cross.blocks_needed(eng.images.mllama.process(p, ims).cross_images)
    assert max(used) == need  # three sequences, one copy of the cross K/V
    assert_pools_clean(llm)


def test_beam_search_matches_a_transformers_reference(mllama_dir):
    from pagedllm.sampling_params import BeamSearchParams

    p, ims = cases()[1]
    width, steps = 2, 3
    beams = [([], 0.0)]
    for _ in range(steps):  # vLLM's algorithm, every beam recomputed by transformers
        cands = []
        for cont, score in beams:
            lp = hf_logprobs(mllama_dir, p, ims, cont + [0])[-1]
            vals, ids = lp.topk(2 * width)
            cands += [(cont + [int(t)], score + float(v)) for v, t in zip(vals, ids)]
        beams = sorted(cands, key=lambda c: -c[1])[:width]
    beams.sort(key=lambda b: -b[1] / (len(p) + len(b[0])))
    llm = make_llm(mllama_dir)
    (out,) = llm.beam_search(as_prompts([(p, ims)]),
                             BeamSearchParams(beam_width=width, max_tokens=steps, ignore_eos=True))
    assert [s.tokens[len(p):] for s in out.sequences] == [b[0] for b in beams]
    for s, b in zip(out.sequences, beams):
        assert s.cum_logprob == pytest.approx(b[1], abs=1e-3)
    assert_pools_clean(llm)


def test_decoder_logits_match_over_a_long_continuation(mllama_dir):
    # decode steps read the cross blocks for many tokens: compare every step's log-probs
    p, ims = cases()[3]
    llm = make_llm(mllama_dir)
    (out,) = llm.generate(as_prompts([(p, ims)]), greedy(max_tokens=12, logprobs=1),
                          use_tqdm=False)
    c = out.outputs[0]
    ref = hf_logprobs(mllama_dir, p, ims, c.token_ids)
    got = torch.tensor([lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)])
    want = ref[torch.arange(len(c.token_ids)), torch.tensor(c.token_ids)]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_requests_with_the_same_images_share_their_cross_blocks(mllama_dir):
    # Same two images in the same order: the second request shares all but the last of the
    # first's cross blocks (a live sequence's last block is not offered for sharing), and
    # writes only that one; the output is unchanged.
    p, ims = cases()[3]
    llm = make_llm(mllama_dir, encoder_cache_images=0)
    eng = llm.engine
    cross = eng.images.cross
    need = cross.blocks_needed(eng.images.mllama.process(p, ims).cross_images)
    eng.add_request("a", as_prompts([(p, ims)])[0], greedy())
    eng.step()  # a is admitted and its cross K/V written
    eng.add_request("b", as_prompts([(p, ims)])[0], greedy())
    eng.add_request("c", {"prompt_token_ids": p, "multi_modal_data": {"image": ims[::-1]}},
                    greedy())  # the same images in the other order: nothing shared
    done = {}
    used = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.outputs[0].token_ids
        used = max(used, cross.kv.stats()["used_blocks"])
    want = hf_greedy(mllama_dir, p, ims, MAX_TOKENS)[0]
    assert done["a"] == done["b"] == want
    assert done["c"] == hf_greedy(mllama_dir, p, ims[::-1], MAX_TOKENS)[0]
    assert used == need + 1 + need  # a's blocks, b's own last block, c's blocks
    assert eng.kv_cache_stats()["cross_prefix_cache_hits"] == (need - 1) * 4
    assert_pools_clean(llm)


def test_chunked_prefill_gives_the_unchunked_result(mllama_dir):
    # 3-token steps: the prompt (text, then the image, text, a second image, text) is split
    # so that chunks start before, at and after each <|image|>; every row's range is the
    # unchunked one (text before the first image sees none: compared with the engine itself,
    # transformers averages there).
    p = text_prompt(4, 7) + [IMG] + text_prompt(3, 8) + [IMG] + text_prompt(4, 9)
    ims = cases()[3][1]
    whole = make_llm(mllama_dir).generate(as_prompts([(p, ims)]), greedy(logprobs=1),
                                          use_tqdm=False)[0].outputs[0]
    chunked = make_llm(mllama_dir, max_num_batched_tokens=3, max_num_seqs=2)
    got = chunked.generate(as_prompts([(p, ims)]), greedy(logprobs=1), use_tqdm=False)[0]
    c = got.outputs[0]
    assert c.token_ids == whole.token_ids
    for a, b, t in zip(c.logprobs, whole.logprobs, c.token_ids):
        assert abs(a[t].logprob - b[t].logprob) < 1e-4
    assert_pools_clean(chunked)


def test_tensor_parallel_refuses_an_mllama_checkpoint_clearly(mllama_dir):
    # It said the architecture was unsupported (config.json was read as a text Llama's).
    with pytest.raises(ValueError, match="is an Mllama checkpoint: multimodal models are not "
                                         "supported with tensor_parallel_size=2") as info:
        LLM(mllama_dir, num_kv_blocks=16, tensor_parallel_size=2, device="cpu")
    assert "architectures" not in str(info.value)


def test_a_cross_pool_past_the_memory_left_is_refused_before_it_is_allocated(mllama_dir,
                                                                              monkeypatch):
    # The pool check ran after the cross pool was allocated and left its bytes out: a self
    # pool that fit passed however large num_cross_kv_blocks was.
    from pagedllm.engine import device as devices

    layout = make_llm(mllama_dir, num_kv_blocks=16, num_cross_kv_blocks=1).engine.executor.layout
    total = 16 * layout.plan.bytes_per_block + 64 * layout.cross_bytes_per_block
    monkeypatch.setattr(devices, "_host_available_bytes", lambda: total - 1)
    with pytest.raises(ValueError, match=r"num_kv_blocks=16\) with its cross-attention pool "
                                         r"takes .* lower num_kv_blocks \(the cross pool: "
                                         r"num_cross_kv_blocks or cross_kv_fraction\)$"):
        make_llm(mllama_dir, num_kv_blocks=16, num_cross_kv_blocks=64)
    monkeypatch.setattr(devices, "_host_available_bytes", lambda: total)
    make_llm(mllama_dir, num_kv_blocks=16, num_cross_kv_blocks=64)  # exactly what is left
