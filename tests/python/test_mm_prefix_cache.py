"""Prefix caching with images: the same image and prompt hit (identical output), one changed
pixel misses from the image's first block on, the text before the image stays shared, and the
persistent tier's keys follow the same rule."""

from __future__ import annotations

import numpy as np

from engine_fixtures import assert_pool_clean
from mm_fixtures import IMAGE_TOKEN, hf_greedy, llava_dir, random_image, text_prompt  # noqa: F401
from pagedllm import LLM, SamplingParams

BS = 4
PREFIX = 10  # text tokens before the image: blocks 0 and 1 are text only, block 2 has both


def run(llm, image, prefix=PREFIX):
    p = text_prompt(prefix, 0) + [IMAGE_TOKEN] + text_prompt(9, 1)
    before = llm.kv_cache_stats()["prefix_cache_hits"]
    (out,) = llm.generate([{"prompt_token_ids": p, "multi_modal_data": {"image": image}}],
                          SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                          use_tqdm=False)
    return out.outputs[0].token_ids, llm.kv_cache_stats()["prefix_cache_hits"] - before


def test_same_image_hits_changed_pixel_misses_past_the_text(llava_dir):
    llm = LLM(llava_dir, num_kv_blocks=256, block_size=BS)
    img = random_image(1)
    first, hits0 = run(llm, img)
    assert hits0 == 0
    again, hits1 = run(llm, img.copy())  # same pixels, another object
    assert again == first
    prompt_len = PREFIX + 16 + 9
    assert hits1 == (prompt_len - 1) // BS * BS  # every full block but the last token's
    changed = img.copy()
    changed.putpixel((3, 5), tuple((v + 1) % 256 for v in changed.getpixel((3, 5))))
    encoded = llm.engine.images.encoder.num_encoded_images
    other, hits2 = run(llm, changed)
    assert hits2 == PREFIX // BS * BS  # only the text-only blocks before the image
    assert llm.engine.images.encoder.num_encoded_images == encoded + 1
    # the changed image is its own entry: it now hits in full, and so does the first again
    assert run(llm, changed) == (other, hits1)
    assert run(llm, img) == (first, hits1)
    assert_pool_clean(llm)


def test_cache_ids_and_persistent_keys_carry_the_image_per_block(llava_dir):
    from pagedllm import _core
    from pagedllm.engine.kv_tier import prompt_keys
    from pagedllm.multimodal.limits import MultiModalLimits
    from pagedllm.multimodal.prompt import ImagePromptProcessor

    proc = ImagePromptProcessor.from_dir(llava_dir, MultiModalLimits())
    p = text_prompt(PREFIX, 0) + [IMAGE_TOKEN] + text_prompt(9, 1)
    img = random_image(1)
    changed = img.copy()
    changed.putpixel((0, 0), (0, 0, 0) if img.getpixel((0, 0)) != (0, 0, 0) else (1, 1, 1))
    a, b = proc.process(p, [img]), proc.process(p, [changed])
    assert a.token_ids == b.token_ids  # the model sees the same placeholder ids
    assert np.array_equal(a.kv_token_ids[:PREFIX], p[:PREFIX])
    assert (a.kv_token_ids[PREFIX:PREFIX + 16] < 0).all()  # never a real token id
    assert (a.kv_token_ids[PREFIX:PREFIX + 16] != b.kv_token_ids[PREFIX:PREFIX + 16]).all()
    kv = _core.KVCacheManager(64, BS, True, 0)
    ha, hb = kv.block_hashes(a.kv_token_ids, 0), kv.block_hashes(b.kv_token_ids, 0)
    first_image_block = PREFIX // BS
    assert (ha[:first_image_block] == hb[:first_image_block]).all()
    assert (ha[first_image_block:] != hb[first_image_block:]).all()
    ka, kb = prompt_keys(a.kv_token_ids, BS, 0), prompt_keys(b.kv_token_ids, BS, 0)
    assert ka[:first_image_block] == kb[:first_image_block]
    assert all(x != y for x, y in zip(ka[first_image_block:], kb[first_image_block:]))


def test_the_block_holding_an_image_start_is_keyed_by_the_image_in_every_slot(llava_dir):
    # An image starting at the last slot of a block: without salting, that block would differ
    # from another image's in one 31-bit id only; the text before it in the block is salted.
    from pagedllm.multimodal.hashing import salt_image_blocks
    from pagedllm.multimodal.limits import MultiModalLimits
    from pagedllm.multimodal.prompt import ImagePromptProcessor

    proc = ImagePromptProcessor.from_dir(llava_dir, MultiModalLimits())
    text = text_prompt(11, 0)
    img, other = random_image(1), random_image(2)

    def ids(prompt_text, image):
        mmp = proc.process(prompt_text + [IMAGE_TOKEN] + [5], [image])
        return salt_image_blocks(mmp.kv_token_ids, mmp.images, BS)

    a, b = ids(text, img), ids(text, other)
    assert np.array_equal(a[:8], text[:8]) and np.array_equal(b[:8], text[:8])
    assert (a[8:12] < 0).all() and (a[8:12] != b[8:12]).all()
    edited = list(text)
    edited[9] += 1
    c = ids(edited, img)  # same image, other text in its block: that slot differs
    assert c[9] != a[9] and np.array_equal(c[10:], a[10:])


def test_persistent_tier_hits_the_same_image_after_a_restart_and_not_another(llava_dir,
                                                                             tmp_path):
    def engine():
        return LLM(llava_dir, num_kv_blocks=256, block_size=BS,
                   persistence={"storage_path": str(tmp_path / "kv")})

    img = random_image(1)
    changed = img.copy()
    changed.putpixel((1, 1), (0, 0, 0) if img.getpixel((1, 1)) != (0, 0, 0) else (9, 9, 9))
    cold = engine()
    first, _ = run(cold, img)
    cold.engine.tier.flush()
    cold.engine.shutdown()
    warm = engine()
    again, _ = run(warm, img)  # nothing in memory: the prompt's blocks come from disk
    assert again == first
    prompt_len = PREFIX + 16 + 9
    hit = warm.kv_cache_stats()["disk_hit_tokens"]
    assert hit == (prompt_len - 1) // BS * BS
    other, _ = run(warm, changed)  # memory has the text blocks; disk has nothing past them
    assert warm.kv_cache_stats()["disk_hit_tokens"] == hit
    warm.engine.shutdown()
    plain = LLM(llava_dir, num_kv_blocks=256, block_size=BS, enable_prefix_caching=False)
    assert run(plain, changed)[0] == other


def test_a_prompt_chunk_of_one_image_position_is_keyed_like_the_rest(llava_dir):
    # Prompt 12 + 16 image positions = 28 tokens (7 full blocks), the image at the end; 9-token
    # steps leave exactly one prompt position (an image one) for the fourth step. The block it
    # fills must be registered under the image's cache ids: a longer prompt with the same
    # image and text then hits all 7 blocks.
    llm = LLM(llava_dir, num_kv_blocks=64, block_size=BS, max_num_seqs=4,
              max_num_batched_tokens=9)
    p = text_prompt(12, 3) + [IMAGE_TOKEN]
    img = random_image(4)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p, "multi_modal_data": {"image": img}}], params,
                 use_tqdm=False)
    before = llm.kv_cache_stats()["prefix_cache_hits"]
    longer = p + text_prompt(5, 4)
    (out,) = llm.generate([{"prompt_token_ids": longer, "multi_modal_data": {"image": img}}],
                          params, use_tqdm=False)
    assert llm.kv_cache_stats()["prefix_cache_hits"] - before == 28
    assert out.outputs[0].token_ids == hf_greedy(llava_dir, longer, [img], 3)
