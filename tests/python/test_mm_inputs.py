"""Bad image input: each case is one clear ValueError, the other requests are unaffected and
no block leaks. Also the data-URL and remote-URL rules of the OpenAI route's image parts."""

from __future__ import annotations

import base64
import re

import pytest

from engine_fixtures import assert_pool_clean
from mm_fixtures import IMAGE_TOKEN, hf_greedy, llava_dir, png_bytes, random_image, text_prompt  # noqa: F401
from pagedllm import LLM, SamplingParams
from pagedllm.multimodal.image_io import ImageInputError, image_from_url
from pagedllm.multimodal.limits import MultiModalLimits

GOOD = text_prompt(4, 0) + [IMAGE_TOKEN] + text_prompt(3, 1)


def mm(images, prompt=GOOD):
    return {"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}


@pytest.fixture(scope="module")
def llm(llava_dir):
    return LLM(llava_dir, num_kv_blocks=64, block_size=4, max_images_per_prompt=2,
               max_image_bytes=4000, max_image_pixels=100 * 100)


def bad_cases():
    img = random_image(1, (20, 20))
    png = png_bytes(img)
    return [
        (mm(b"not an image at all"), "not a PNG or JPEG"),
        (mm(png[:len(png) // 2]), "corrupt or truncated PNG image data"),
        (mm(None, text_prompt(4, 0)), "multi_modal_data['image'] is None"),
        (mm([img, None], GOOD + [IMAGE_TOKEN]), "multi_modal_data['image'][1] is None"),
        (mm(png_bytes(img, "GIF")), "unsupported image format GIF"),
        (mm(png_bytes(img, "BMP")), "unsupported image format BMP"),
        (mm([img, img]), "2 image(s) were given"),
        (mm([], GOOD), "1 image placeholder"),
        (mm(img, GOOD + [IMAGE_TOKEN]), "2 image placeholder"),
        (mm([img] * 3, [IMAGE_TOKEN] * 3), "max_images_per_prompt = 2"),
        (mm(random_image(2, (200, 60))), "max_image_pixels = 10000"),
        (mm(png_bytes(random_image(3, (90, 90)))), "max_image_bytes = 4000"),
        (mm("file.png"), "PIL.Image.Image or the bytes"),
        ({"prompt_token_ids": GOOD, "multi_modal_data": {"audio": b""}}, "only ['image']"),
    ]


def test_each_bad_image_input_is_one_clear_error_and_others_carry_on(llm, llava_dir):
    eng = llm.engine
    eng.add_request("ok", mm(random_image(5)), SamplingParams(temperature=0, max_tokens=4,
                                                              ignore_eos=True))
    for prompt, message in bad_cases():
        with pytest.raises(ValueError, match=re.escape(message)):
            eng.add_request(None, prompt, SamplingParams(max_tokens=2))
    outs = {}
    while eng.has_unfinished_requests():
        outs.update({o.request_id: o for o in eng.step() if o.finished})
    assert list(outs) == ["ok"]
    assert outs["ok"].outputs[0].token_ids == hf_greedy(llava_dir, GOOD, [random_image(5)], 4)
    assert eng.images.encoder.num_cached == 1  # the good image, kept for reuse (unused)
    assert_pool_clean(llm)


def test_an_image_for_a_text_only_model_is_refused(tmp_path):
    from pagedllm.model import write_random_checkpoint

    write_random_checkpoint(tmp_path, preset=dict(hidden_size=64, num_hidden_layers=1,
                                                  num_attention_heads=4, num_key_value_heads=2,
                                                  intermediate_size=64, vocab_size=300))
    llm = LLM(str(tmp_path), num_kv_blocks=16)
    with pytest.raises(ValueError, match="is text-only"):
        llm.generate([mm(random_image(1), [5, 6, 7])], SamplingParams(max_tokens=2),
                     use_tqdm=False)
    assert_pool_clean(llm)


def test_encoder_budget_below_one_image_is_a_config_error(llava_dir):
    with pytest.raises(ValueError, match="max_num_encoder_tokens = 8 is below one image's 16"):
        LLM(llava_dir, num_kv_blocks=16, max_num_encoder_tokens=8)


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def test_data_urls_and_remote_urls():
    limits = MultiModalLimits(max_image_bytes=2000)
    img = random_image(4, (12, 9))
    got = image_from_url(data_url(png_bytes(img)), limits)
    assert got.size == (12, 9) and got.tobytes() == img.tobytes()
    assert image_from_url(data_url(png_bytes(img, "JPEG"), "image/jpeg"), limits).size == (12, 9)
    refused = [
        ("https://example.com/cat.png", "not in --allowed-media-domains"),
        ("http://10.0.0.1/x.png", "remote image URL refused"),
        ("file:///etc/passwd", "expected a data: URL"),
        ("data:image/png,rawbytes", "malformed data URL"),
        ("data:image/png;base64,@@@@", "base64 payload is invalid"),
        (data_url(png_bytes(img), "image/gif"), "media type 'image/gif'"),
        (data_url(png_bytes(img), "image/jpeg"), "says JPEG but the data is PNG"),
        (data_url(b"x" * 3000), "max_image_bytes = 2000"),
    ]
    for url, message in refused:
        with pytest.raises(ImageInputError, match=re.escape(message)):
            image_from_url(url, limits)
    with pytest.raises(ImageInputError, match="does not fetch remote media"):
        image_from_url("https://cdn.example.com/cat.png", limits, ["example.com"])


def test_image_limits_come_from_flags_and_yaml(tmp_path):
    import argparse

    from pagedllm.commands.common import add_engine_args, engine_config
    from pagedllm.config import EngineConfig

    cfg = EngineConfig.from_dict({"multimodal": {"max_images_per_prompt": 2,
                                                 "max_num_encoder_tokens": 64}})
    assert (cfg.max_images_per_prompt, cfg.max_num_encoder_tokens) == (2, 64)
    with pytest.raises(ValueError, match="max_image_pixels must be a positive integer"):
        EngineConfig(max_image_pixels=0)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--max-images-per-prompt", "3", "--max-image-bytes", "1MiB"])
    cfg = engine_config(args)
    assert (cfg.max_images_per_prompt, cfg.max_image_bytes) == (3, 1 << 20)
