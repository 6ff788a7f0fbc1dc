"""LLaVA against transformers on tiny random checkpoints: the vision tower and preprocessing
match exactly, and the engine's greedy tokens equal transformers' with 0, 1 and 2 images,
batched with text-only requests, with an image split across prefill chunks, under preemption
(recompute and swap) and with n > 1, with logprobs close."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_fixtures import assert_pool_clean
from mm_fixtures import (IMAGE_TOKEN, hf_greedy, hf_logprobs, llava_dir, random_image,  # noqa: F401
                         text_prompt, write_tiny_llava)
from pagedllm import LLM, SamplingParams

MAX_TOKENS = 6


def greedy(**kw):
    return SamplingParams(temperature=0.0, max_tokens=kw.pop("max_tokens", MAX_TOKENS),
                          ignore_eos=True, **kw)


def cases():
    """(prompt ids with placeholders, images): 0, 1 and 2 images, images first/middle/last."""
    a, b, c = random_image(1), random_image(2, (20, 60)), random_image(3, (64, 64))
    return [
        (text_prompt(11, 0), []),
        (text_prompt(5, 1) + [IMAGE_TOKEN] + text_prompt(4, 2), [a]),
        ([IMAGE_TOKEN] + text_prompt(3, 3), [b]),
        (text_prompt(3, 4) + [IMAGE_TOKEN] + text_prompt(2, 5) + [IMAGE_TOKEN] + [7], [a, c]),
        (text_prompt(20, 6), []),
        (text_prompt(2, 7) + [IMAGE_TOKEN], [c]),
    ]


def as_prompts(cs):
    return [{"prompt_token_ids": p, "multi_modal_data": {"image": ims}} if ims
            else {"prompt_token_ids": p} for p, ims in cs]


@pytest.mark.parametrize("strategy,layer", [("default", -2), ("full", -1), ("default", [-3, -1])])
def test_vision_tower_and_preprocessing_match_transformers(tmp_path, strategy, layer):
    from transformers import CLIPImageProcessorPil, LlavaForConditionalGeneration

    from pagedllm.model import load_model
    from pagedllm.multimodal.image_io import load_image
    from pagedllm.multimodal.limits import MultiModalLimits
    from pagedllm.multimodal.processor import ImageProcessorConfig, preprocess

    path = write_tiny_llava(str(tmp_path), seed=3, strategy=strategy, feature_layer=layer)
    ours, _ = load_model(path)
    hf = LlavaForConditionalGeneration.from_pretrained(path).eval()
    proc, cfg = CLIPImageProcessorPil.from_pretrained(path), ImageProcessorConfig.from_dir(path)
    images = [random_image(i, size) for i, size in enumerate([(40, 33), (28, 28), (9, 70)])]
    rgba = random_image(7, (30, 30)).convert("RGBA")
    rgba.putalpha(random_image(8, (30, 30)).convert("L"))  # transparency: composited on white
    images += [rgba, random_image(9, (31, 29)).convert("L"), random_image(10).convert("P")]
    raw, images = images, [load_image(im, MultiModalLimits()) for im in images]
    pixels = np.stack([preprocess(im, cfg) for im in images])
    ref_pixels = proc(raw, return_tensors="np")["pixel_values"]  # its own RGB conversion
    assert np.array_equal(pixels, ref_pixels)
    with torch.inference_mode():
        ref = hf.model.get_image_features(torch.from_numpy(ref_pixels), vision_feature_layer=layer,
                                          vision_feature_select_strategy=strategy).pooler_output
    got = ours.encode_images(torch.from_numpy(pixels))
    torch.testing.assert_close(got, torch.stack(list(ref)), rtol=1e-5, atol=1e-5)


def test_greedy_matches_transformers_batched_with_text(llava_dir):
    cs = cases()
    llm = LLM(llava_dir, num_kv_blocks=128, block_size=4)
    outs = llm.generate(as_prompts(cs), greedy(logprobs=1), use_tqdm=False)
    for (p, ims), out in zip(cs, outs):
        c = out.outputs[0]
        assert c.token_ids == hf_greedy(llava_dir, p, ims, MAX_TOKENS), (p, len(ims))
        ref = hf_logprobs(llava_dir, p, ims, c.token_ids)
        for i, (tok, lp) in enumerate(zip(c.token_ids, c.logprobs)):
            assert abs(lp[tok].logprob - float(ref[i, tok])) < 1e-4
    # every image prompt's expanded length: one placeholder became 16 positions
    assert len(outs[1].prompt_token_ids) == len(cs[1][0]) - 1 + 16
    # each distinct image was encoded once (a appears twice in the batch)
    assert llm.engine.images.encoder.num_encoded_images == 3
    assert llm.engine.images.encoder.num_cached == 3  # unused now, kept for reuse (<= 8)
    llm.generate(as_prompts(cs[1:2]), greedy(), use_tqdm=False)
    assert llm.engine.images.encoder.num_encoded_images == 3  # a repeated image: no encode
    assert_pool_clean(llm)


def test_image_split_across_prefill_chunks_and_preemption(llava_dir):
    # 8-token steps: every image (16 positions) is computed over at least two chunks; 14 blocks
    # of 4 tokens cannot hold the batch, so sequences are preempted and recomputed.
    cs = cases()
    for mode in ("recompute", "swap"):
        llm = LLM(llava_dir, num_kv_blocks=14, block_size=4, max_num_seqs=4,
                  max_num_batched_tokens=8, preemption_mode=mode, swap_space=0.01,
                  watermark=0.0)
        outs = llm.generate(as_prompts(cs), greedy(max_tokens=10), use_tqdm=False)
        for (p, ims), out in zip(cs, outs):
            assert out.outputs[0].token_ids == hf_greedy(llava_dir, p, ims, 10), (mode, p)
        assert llm.engine.scheduler.num_preemptions > 0
        if mode == "swap":
            assert llm.engine.scheduler.num_swap_outs > 0
        # the encoder ran once per image per request, across chunks and preemptions
        assert llm.engine.images.encoder.num_encoded_images <= 4
        assert_pool_clean(llm)


def test_n_greater_than_one_shares_the_image_prompt(llava_dir):
    p, ims = cases()[3]
    llm = LLM(llava_dir, num_kv_blocks=64, block_size=4)
    (out,) = llm.generate(as_prompts([(p, ims)]), greedy(n=3), use_tqdm=False)
    ref = hf_greedy(llava_dir, p, ims, MAX_TOKENS)
    assert [c.token_ids for c in out.outputs] == [ref] * 3
    seeded = SamplingParams(temperature=1.0, n=2, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True)
    (a,) = llm.generate(as_prompts([(p, ims)]), seeded, use_tqdm=False)
    (b,) = llm.generate(as_prompts([(p, ims), cases()[0]]), seeded, use_tqdm=False)[:1]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert_pool_clean(llm)


def test_encoder_budget_spreads_image_work_and_decodes_keep_running(llava_dir):
    # Encoder budget = one image: a prompt with 3 distinct images encodes one per step while a
    # text request that is decoding gets a token in every step.
    llm = LLM(llava_dir, num_kv_blocks=128, block_size=4, max_num_encoder_tokens=16)
    eng = llm.engine
    steps = []
    real = eng.executor.execute_model

    def spy(out):
        mm = out.multimodal
        steps.append((0 if mm is None else 16 * len(mm.encode), out.num_decode_seqs))
        return real(out)

    eng.executor.execute_model = spy
    eng.add_request("text", {"prompt_token_ids": text_prompt(5, 9)}, greedy(max_tokens=30))
    eng.step()  # its prompt
    imgs = [random_image(10 + i) for i in range(3)]
    heavy = text_prompt(2, 8) + [IMAGE_TOKEN, IMAGE_TOKEN, IMAGE_TOKEN] + [5]
    eng.add_request("heavy", {"prompt_token_ids": heavy, "multi_modal_data": {"image": imgs}},
                    greedy())
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    encoded = [e for e, _ in steps]
    assert max(encoded) <= 16 and sum(encoded) == 48
    assert all(d >= 1 for e, d in steps[1:] if e)  # the decode ran in every encoding step
    assert done["heavy"].outputs[0].token_ids == hf_greedy(llava_dir, heavy, imgs, MAX_TOKENS)


def test_beam_search_with_an_image_matches_a_transformers_reference(llava_dir):
    from pagedllm.sampling_params import BeamSearchParams

    p, ims = cases()[1]
    width, steps = 2, 4
    beams = [([], 0.0)]
    for _ in range(steps):  # vLLM's algorithm, every beam recomputed by transformers
        cands = []
        for cont, score in beams:
            lp = hf_logprobs(llava_dir, p, ims, cont + [0])[-1]
            vals, ids = lp.topk(2 * width)
            cands += [(cont + [int(t)], score + float(v)) for v, t in zip(vals, ids)]
        beams = sorted(cands, key=lambda c: -c[1])[:width]
    n_prompt = len(p) - 1 + 16
    beams.sort(key=lambda b: -b[1] / (n_prompt + len(b[0])))
    llm = LLM(llava_dir, num_kv_blocks=64, block_size=4)
    (out,) = llm.beam_search(as_prompts([(p, ims)]),
                             BeamSearchParams(beam_width=width, max_tokens=steps, ignore_eos=True))
    assert [s.tokens[n_prompt:] for s in out.sequences] == [b[0] for b in beams]
    for s, b in zip(out.sequences, beams):
        assert s.cum_logprob == pytest.approx(b[1], abs=1e-3)
    assert_pool_clean(llm)
