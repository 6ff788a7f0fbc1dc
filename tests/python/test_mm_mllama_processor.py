"""Mllama's image preprocessing against transformers' MllamaImageProcessorPil: pixel values,
aspect-ratio ids, aspect-ratio masks and tile counts identical for many sizes (every aspect
ratio), image modes and processor configs; preprocessor_config.json read as transformers
writes it; bad configs and bad images refused with a clear error."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from mllama_fixtures import hf_image_processor, random_image, tiny_preprocessor_config
from mm_fixtures import png_bytes
from pagedllm.multimodal.image_io import ImageInputError
from pagedllm.multimodal.limits import MultiModalLimits
from pagedllm.multimodal.mllama_processor import (MllamaImageProcessorConfig, preprocess_mllama,
                                                  process_images, stack_images,
                                                  supported_aspect_ratios)

# (width, height): tiny, exact tiles, wide, tall, extreme, odd, large (downscaled)
SIZES = [(1, 1), (9, 70), (28, 28), (40, 33), (56, 28), (28, 56), (30, 50), (28, 57), (84, 28),
         (28, 84), (300, 5), (5, 300), (56, 56), (57, 55), (113, 27), (90, 60), (200, 30),
         (31, 260), (400, 390)]


def hf_config_kwargs(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "image_processor_type"}


def assert_same(got_images, ref) -> None:
    px, ids, mask = stack_images(got_images)
    assert px.dtype == np.float32 and ids.dtype == np.int64 and mask.dtype == np.int64
    assert np.array_equal(px, ref["pixel_values"][0])
    assert np.array_equal(ids, ref["aspect_ratio_ids"][0])
    assert np.array_equal(mask, ref["aspect_ratio_mask"][0])
    assert [im.num_tiles for im in got_images] == ref["num_tiles"][0]


@pytest.mark.parametrize("make", [
    lambda seed, size: random_image(seed, size),
    lambda seed, size: random_image(seed, size, "RGBA"),  # random alpha: onto white
    lambda seed, size: random_image(seed, size, "L"),
    lambda seed, size: random_image(seed, size).convert("P"),
], ids=["RGB", "RGBA", "L", "P"])
def test_matches_transformers_every_size_and_aspect_ratio(make):
    proc = hf_image_processor()
    cfg = MllamaImageProcessorConfig.from_dict(tiny_preprocessor_config())
    seen = set()
    for seed, size in enumerate(SIZES):
        image = make(seed, size)
        got = preprocess_mllama(image, cfg)
        assert_same([got], proc([[image]], return_tensors="np"))
        seen.add(got.aspect_ratio)
    assert seen == set(supported_aspect_ratios(4))  # every aspect-ratio id was compared


def _palette_with_transparency(seed, size):
    image = random_image(seed, size).convert("P")
    image.info["transparency"] = 0  # palette entry 0 transparent: composited onto white
    return image


def _sixteen_bit(seed, size):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 65536, (size[1], size[0])).astype(np.uint16))


@pytest.mark.parametrize("make", [
    lambda seed, size: random_image(seed, size, "RGBA").convert("LA"),
    lambda seed, size: random_image(seed, size).convert("CMYK"),
    lambda seed, size: random_image(seed, size).convert("1"),
    _palette_with_transparency, _sixteen_bit,
], ids=["LA", "CMYK", "1", "P-transparency", "I16"])
def test_less_common_modes_match_transformers(make):
    proc = hf_image_processor()
    cfg = MllamaImageProcessorConfig.from_dict(tiny_preprocessor_config())
    for seed, size in enumerate(SIZES[::4]):
        image = make(seed, size)
        assert_same([preprocess_mllama(image, cfg)], proc([[image]], return_tensors="np"))


def test_two_images_of_one_prompt_match_transformers_batch():
    proc = hf_image_processor()
    cfg = MllamaImageProcessorConfig.from_dict(tiny_preprocessor_config())
    images = [random_image(1, (90, 30)), random_image(2, (20, 20), "L")]  # 3 tiles and 1 tile
    got = [preprocess_mllama(im, cfg) for im in images]
    assert [im.num_tiles for im in got] == [3, 1]
    assert_same(got, proc([images], return_tensors="np"))


@pytest.mark.parametrize("change", [
    dict(size={"height": 56, "width": 56}, max_image_tiles=2, resample=3),
    dict(max_image_tiles=6, resample=0),
    dict(do_normalize=False),
    dict(do_rescale=False),
    dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], rescale_factor=0.005),
    dict(max_image_tiles=1, resample=1),
], ids=["tile56-2tiles-bicubic", "6tiles-nearest", "no-normalize", "no-rescale", "mean-std",
        "1tile-lanczos"])
def test_other_configs_match_transformers(change):
    from transformers import MllamaImageProcessorPil

    d = {**tiny_preprocessor_config(), **change}
    proc = MllamaImageProcessorPil(**hf_config_kwargs(d))
    cfg = MllamaImageProcessorConfig.from_dict(d)
    for seed, size in enumerate(SIZES[::2]):
        image = random_image(seed, size, "RGBA" if seed % 3 == 0 else "RGB")
        assert_same([preprocess_mllama(image, cfg)], proc([[image]], return_tensors="np"))


def test_defaults_match_transformers_defaults():
    """No preprocessor_config.json: transformers' MllamaImageProcessor defaults (224 tiles,
    4 tiles, bilinear, mean/std 0.5)."""
    from transformers import MllamaImageProcessorPil

    image = random_image(3, (500, 230))
    assert_same([preprocess_mllama(image, MllamaImageProcessorConfig())],
                MllamaImageProcessorPil()([[image]], return_tensors="np"))


def test_reads_preprocessor_config_as_transformers_writes_it(tmp_path):
    hf_image_processor().save_pretrained(str(tmp_path))
    cfg = MllamaImageProcessorConfig.from_dir(str(tmp_path))
    assert cfg == MllamaImageProcessorConfig.from_dict(tiny_preprocessor_config())
    assert (cfg.tile_size, cfg.max_image_tiles, cfg.resample) == (28, 4, 2)
    assert MllamaImageProcessorConfig.from_dir(str(tmp_path / "none")) == \
        MllamaImageProcessorConfig()


@pytest.mark.parametrize("change,match", [
    (dict(do_pad=False), r"do_pad = False: MllamaImageProcessor needs it true"),
    (dict(do_resize=False), r"do_resize = False"),
    (dict(do_convert_rgb=False), r"do_convert_rgb = False"),
    (dict(size={"height": 28, "width": 56}), r"size = .*square tiles"),
    (dict(size={"shortest_edge": 28}), r"size = .*square tiles"),
    (dict(max_image_tiles=0), r"max_image_tiles = 0: expected an integer in \[1, 64\]"),
    (dict(max_image_tiles="4"), r"max_image_tiles = '4'"),
    (dict(resample=9), r"resample = 9: expected a Pillow filter id"),
    (dict(image_std=[0.5, 0.0, 0.5]), r"image_mean / image_std = .*std positive"),
    (dict(image_mean=[0.5, 0.5]), r"expected 3 values each"),
    (dict(image_mean="grey"), r"image_mean / image_std / rescale_factor = 'grey'"),
])
def test_bad_config_refused(change, match):
    with pytest.raises(ValueError, match=match):
        MllamaImageProcessorConfig.from_dict({**tiny_preprocessor_config(), **change})


def test_bad_config_file_named(tmp_path):
    file = tmp_path / "preprocessor_config.json"
    file.write_text(json.dumps({**tiny_preprocessor_config(), "do_pad": False}))
    with pytest.raises(ValueError, match=rf"{file}: do_pad = False"):
        MllamaImageProcessorConfig.from_dir(str(tmp_path))


def test_check_vision():
    cfg = MllamaImageProcessorConfig.from_dict(tiny_preprocessor_config())
    cfg.check_vision(image_size=28, max_num_tiles=4, max_aspect_ratio_id=8)
    for bad in (dict(image_size=56, max_num_tiles=4, max_aspect_ratio_id=8),
                dict(image_size=28, max_num_tiles=2, max_aspect_ratio_id=8),
                dict(image_size=28, max_num_tiles=4, max_aspect_ratio_id=3)):
        with pytest.raises(ValueError, match=r"preprocessor_config.json \(size 28, "
                                             r"max_image_tiles 4, 8 aspect ratios\) does not "
                                             r"fit vision_config"):
            cfg.check_vision(**bad)


# ---- images through image_io: decoding, limits, hashes -------------------------------------

def test_encoded_images_decode_to_the_same_inputs_and_hash():
    cfg = MllamaImageProcessorConfig.from_dict(tiny_preprocessor_config())
    image = random_image(4, (70, 40))
    from_pil, from_png = process_images([image, png_bytes(image)], cfg, MultiModalLimits())
    assert np.array_equal(from_pil.pixel_values, from_png.pixel_values)
    assert from_pil.content_hash == from_png.content_hash
    changed = image.copy()
    changed.putpixel((3, 5), (0, 0, 0) if image.getpixel((3, 5)) != (0, 0, 0) else (1, 1, 1))
    (other,) = process_images([changed], cfg, MultiModalLimits())
    assert other.content_hash != from_pil.content_hash


def _truncated_png():
    return png_bytes(random_image(5, (64, 64)))[:200]


@pytest.mark.parametrize("images,limits,match,error", [
    ([b"not an image at all"], MultiModalLimits(), r"not a PNG or JPEG file", ImageInputError),
    ([_truncated_png()], MultiModalLimits(), r"corrupt or truncated PNG image data",
     ImageInputError),
    ([png_bytes(random_image(6, (8, 8)), "GIF")], MultiModalLimits(),
     r"unsupported image format GIF", ImageInputError),
    ([random_image(7, (90, 90))], MultiModalLimits(max_image_pixels=4096),
     r"90x90 = 8100 pixels exceeds max_image_pixels = 4096", ImageInputError),
    ([random_image(8)] * 3, MultiModalLimits(max_images_per_prompt=2),
     r"the prompt has 3 images; at most max_images_per_prompt = 2", ValueError),
    (["image.png"], MultiModalLimits(), r"must be a PIL.Image.Image or the bytes",
     ImageInputError),
], ids=["garbage", "truncated", "gif", "pixels", "count", "type"])
def test_bad_images_refused(images, limits, match, error):
    cfg = MllamaImageProcessorConfig.from_dict(tiny_preprocessor_config())
    with pytest.raises(error, match=match):
        process_images(images, cfg, limits)


def test_stack_needs_an_image():
    with pytest.raises(ValueError, match="at least one image"):
        stack_images([])


def test_written_checkpoint_has_a_readable_preprocessor(tmp_path):
    """The fixture checkpoint mlt's tests load carries this config (a sanity check of the
    fixture itself)."""
    from mllama_fixtures import write_tiny_mllama

    path = write_tiny_mllama(str(tmp_path))
    assert os.path.isfile(os.path.join(path, "preprocessor_config.json"))
    assert MllamaImageProcessorConfig.from_dir(path).tile_size == 28
