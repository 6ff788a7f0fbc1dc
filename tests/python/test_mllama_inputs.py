"""Mllama requests: prefix caching keyed by the image, bad input refused with one clear error
each while the other requests run on, nothing leaked in either pool; the loader's layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mm_fixtures import png_bytes
from mllama_fixtures import (IMAGE_TOKEN, assert_pools_clean, hf_greedy, random_image,
                             text_prompt, tiny_hf_model, write_test_checkpoint)
from pagedllm import LLM, SamplingParams

IMG = IMAGE_TOKEN


@pytest.fixture(scope="module")
def mllama_dir(tmp_path_factory) -> str:
    return write_test_checkpoint(str(tmp_path_factory.mktemp("mllama")))


def greedy(n=6):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def prompt(ids, images):
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}


def test_prefix_cache_hits_for_the_same_image_and_misses_for_one_changed_pixel(mllama_dir):
    llm = LLM(mllama_dir, num_kv_blocks=128, num_cross_kv_blocks=32, block_size=4)
    eng = llm.engine
    pre = text_prompt(8, 0)  # two full text blocks before the image: shared by every image
    ids = pre + [IMG] + text_prompt(12, 1)
    img = random_image(5, (40, 20))
    first = llm.generate([prompt(ids, [img])], greedy(), use_tqdm=False)[0]

    def cached_after(p):
        before = eng.kv_cache_stats()["prefix_cache_hits"]
        out = llm.generate([p], greedy(), use_tqdm=False)[0]
        return out, eng.kv_cache_stats()["prefix_cache_hits"] - before

    again, hit = cached_after(prompt(ids, [img.copy()]))
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert hit == (len(ids) - 1) // 4 * 4  # every full block but the last token's
    changed = np.asarray(img).copy()
    changed[3, 7, 1] ^= 1
    from PIL import Image

    other, hit = cached_after(prompt(ids, [Image.fromarray(changed)]))
    assert hit == 8  # only the text blocks before the image's block
    fresh = LLM(mllama_dir, num_kv_blocks=128, num_cross_kv_blocks=32, block_size=4,
                enable_prefix_caching=False)
    alone = fresh.generate([prompt(ids, [Image.fromarray(changed)])], greedy(), use_tqdm=False)
    assert other.outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert_pools_clean(llm)


def test_bad_inputs_get_one_clear_error_each_and_others_run(mllama_dir):
    llm = LLM(mllama_dir, num_kv_blocks=128, num_cross_kv_blocks=32, block_size=4,
              max_images_per_prompt=2)
    eng = llm.engine
    good = [IMG] + text_prompt(5, 3)
    img = random_image(1, (40, 20))
    eng.add_request("good", prompt(good, [img]), greedy())
    eng.add_request("text", {"prompt_token_ids": text_prompt(7, 4)}, greedy())
    eng.step()
    bad = [
        (prompt([IMG, IMG] + text_prompt(3, 5), [img]), r"2 <\|image\|> token\(s\).*1 image"),
        (prompt(text_prompt(3, 5), [img]), r"0 <\|image\|> token\(s\).*1 image"),
        (prompt([IMG] * 3 + [5], [img] * 3), "max_images_per_prompt = 2"),
        (prompt([IMG, 5], [b"not an image" * 4]), "not a PNG or JPEG"),
        (prompt([IMG, 5], [b"\x89PNG\r\n\x1a\n" + b"garbage" * 10]), "corrupt or truncated"),
        (prompt([IMG, 5], [png_bytes(img)[:60]]), "corrupt or truncated"),
        (prompt([IMG, 5], [png_bytes(img, "GIF")]), "unsupported image format GIF"),
        ({"prompt_token_ids": [IMG, 5]}, r"1 <\|image\|> token\(s\).*0 image"),
    ]
    for p, match in bad:
        with pytest.raises(ValueError, match=match):
            eng.add_request(None, p, greedy())
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.outputs[0].token_ids
    assert done["good"] == hf_greedy(mllama_dir, good, [img], 6)[0]
    assert done["text"] == hf_greedy(mllama_dir, text_prompt(7, 4), [], 6)[0]
    assert_pools_clean(llm)


def test_images_that_can_never_fit_are_refused(mllama_dir):
    llm = LLM(mllama_dir, num_kv_blocks=64, num_cross_kv_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="cross pool has 2.*num_cross_kv_blocks"):
        llm.engine.add_request(None, prompt([IMG, 5], [random_image(1, (40, 20))]), greedy())
    llm = LLM(mllama_dir, num_kv_blocks=64, num_cross_kv_blocks=32, block_size=4,
              max_num_encoder_tokens=6)
    with pytest.raises(ValueError, match="max_num_encoder_tokens = 6"):
        llm.engine.add_request(None, prompt([IMG, 5], [random_image(1, (40, 20))]), greedy())
    assert_pools_clean(llm)


def test_abort_frees_the_cross_blocks(mllama_dir):
    llm = LLM(mllama_dir, num_kv_blocks=64, num_cross_kv_blocks=16, block_size=4)
    eng = llm.engine
    eng.add_request("a", prompt([IMG] + text_prompt(4, 1), [random_image(2)]),
                    SamplingParams(temperature=0.0, max_tokens=50, n=2))
    eng.step()
    eng.step()
    assert eng.images.cross.kv.num_free_blocks < 16
    eng.abort_request("a")
    assert_pools_clean(llm)


def test_cross_kv_sizing_splits_the_budget(mllama_dir):
    llm = LLM(mllama_dir, kv_cache_memory_bytes=1 << 20, block_size=4, cross_kv_fraction=0.5)
    s = llm.kv_cache_stats()
    cross = llm.engine.images.cross.kv
    cross_bytes = s["cross_bytes_per_block"] * cross.num_blocks
    slack = s["cross_bytes_per_block"] + s["bytes_per_block"]  # the split rounds to blocks
    assert abs(cross_bytes - s["kv_cache_bytes"]) <= slack
    assert s["kv_cache_bytes"] + cross_bytes <= 1 << 20
    # num_kv_blocks fixes the self pool; the cross pool gets the fraction of the total
    llm = LLM(mllama_dir, num_kv_blocks=100, block_size=4, cross_kv_fraction=0.2)
    s = llm.kv_cache_stats()
    assert s["num_blocks"] == 100
    want = int(100 * s["bytes_per_block"] * 0.2 / 0.8) // s["cross_bytes_per_block"]
    assert s["cross_blocks"] == want
    with pytest.raises(ValueError, match="cross_kv_fraction"):
        LLM(mllama_dir, kv_cache_memory_bytes=40_000, block_size=4, cross_kv_fraction=0.01)


def test_loader_accepts_both_layouts_and_lists_problems(tmp_path):
    from safetensors.torch import save_file

    from pagedllm.model import CheckpointError, load_model
    from pagedllm.model.mllama import MllamaForConditionalGeneration

    path = write_test_checkpoint(str(tmp_path / "a"), seed=1)  # original layout (save_pretrained)
    a, cfg = load_model(path)
    assert isinstance(a, MllamaForConditionalGeneration)
    assert cfg.num_hidden_layers == 2  # the self-attention layers: what the self pool holds
    hf = tiny_hf_model(1)
    tensors = {k: v.contiguous() for k, v in hf.state_dict().items()}  # in-memory layout
    save_file(tensors, str(tmp_path / "a" / "model.safetensors"))
    b, _ = load_model(path)
    for (n1, p1), (n2, p2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    del tensors["model.language_model.layers.1.cross_attn.k_norm.weight"]
    tensors["model.language_model.layers.1.cross_attn.extra"] = torch.zeros(2)
    save_file(tensors, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        load_model(path)
    assert "missing tensor 'model.layers.1.cross_attn.k_norm.weight'" in str(e.value)
    assert "unexpected tensor 'model.language_model.layers.1.cross_attn.extra'" in str(e.value)


def test_a_failing_step_frees_both_pools_and_the_engine_carries_on(mllama_dir):
    llm = LLM(mllama_dir, num_kv_blocks=64, num_cross_kv_blocks=16, block_size=4)
    eng = llm.engine
    model = eng.executor.worker.model
    real = model.write_cross_kv
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("injected write failure")

    model.write_cross_kv = broken
    ids, img = [IMG] + text_prompt(4, 1), random_image(2)
    (out,) = llm.generate([prompt(ids, [img])], greedy(), use_tqdm=False)
    assert out.outputs[0].finish_reason == "error" and "injected write failure" in out.error
    assert calls and eng.images.cross.kv.num_free_blocks == 16
    model.write_cross_kv = real
    (out,) = llm.generate([prompt(ids, [img])], greedy(), use_tqdm=False)
    assert out.outputs[0].token_ids == hf_greedy(mllama_dir, ids, [img], 6)[0]
    assert_pools_clean(llm)


def test_persistent_tier_hits_the_same_image_after_a_restart_and_not_another(mllama_dir,
                                                                             tmp_path):
    from PIL import Image

    def engine():
        return LLM(mllama_dir, num_kv_blocks=128, num_cross_kv_blocks=32, block_size=4,
                   persistence={"storage_path": str(tmp_path / "kv")})

    ids = text_prompt(8, 2) + [IMG] + text_prompt(11, 3)
    img = random_image(4, (40, 20))
    changed = np.asarray(img).copy()
    changed[0, 0, 0] ^= 1
    cold = engine()
    first = cold.generate([prompt(ids, [img])], greedy(), use_tqdm=False)[0]
    cold.engine.tier.flush()
    cold.engine.shutdown()
    warm = engine()  # nothing in memory: the prompt's blocks come from disk, cross K/V anew
    again = warm.generate([prompt(ids, [img])], greedy(), use_tqdm=False)[0]
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    hit = warm.kv_cache_stats()["disk_hit_tokens"]
    assert hit == (len(ids) - 1) // 4 * 4
    warm.generate([prompt(ids, [Image.fromarray(changed)])], greedy(), use_tqdm=False)
    assert warm.kv_cache_stats()["disk_hit_tokens"] == hit  # nothing past the text blocks
    assert_pools_clean(warm)
    warm.engine.shutdown()
