"""The OpenAI chat route with images: `image_url` parts with data: URLs give transformers'
greedy tokens; remote URLs, bad data and limits are clear 400s and the server carries on."""

from __future__ import annotations

import base64
import json
import os

import httpx
import pytest

from mm_fixtures import IMAGE_TOKEN, VOCAB, hf_greedy, png_bytes, random_image, write_tiny_llava
from server_fixtures import serve_tiny_model


def write_word_tokenizer(path: str) -> None:
    """A whitespace word-level tokenizer: w3..w249 are ids 3..249, <image> is IMAGE_TOKEN."""
    from tokenizers import Tokenizer, models, pre_tokenizers, AddedToken

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, IMAGE_TOKEN)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens([AddedToken("<image>", normalized=False)])
    assert tk.token_to_id("<image>") == IMAGE_TOKEN and tk.get_vocab_size() <= VOCAB
    tk.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "</s>",
                   "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}, f)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny_llava(str(tmp_path_factory.mktemp("llava_chat")))
    write_word_tokenizer(path)
    from pagedllm.server.state import ServerSettings

    settings = ServerSettings(allowed_media_domains=("example.com",), max_request_bytes=1 << 22)
    with serve_tiny_model(path, settings, num_kv_blocks=128, block_size=4,
                          max_image_bytes=50_000) as srv:
        yield srv, path


def chat(srv, parts, **kw):
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 5,
            "temperature": 0, "ignore_eos": True, **kw}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def data_url(img, fmt="PNG"):
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(png_bytes(img, fmt)).decode()}"


def test_chat_with_data_url_images_matches_transformers(server):
    import io

    from PIL import Image

    srv, path = server
    a, b = random_image(1), random_image(2, (30, 50))
    r = chat(srv, [{"type": "text", "text": "w5 w6"}, image_part(data_url(a)),
                   {"type": "text", "text": "w7"}, image_part(data_url(b, "JPEG"))],
             logprobs=True, return_tokens_as_token_ids=True)
    assert r.status_code == 200, r.text
    got = r.json()
    tokens = [int(t["token"].split(":")[1]) for t in got["choices"][0]["logprobs"]["content"]]
    jpeg = Image.open(io.BytesIO(png_bytes(b, "JPEG"))).convert("RGB")  # what the server sees
    assert tokens == hf_greedy(path, [5, 6, IMAGE_TOKEN, 7, IMAGE_TOKEN], [a, jpeg], 5)
    assert got["usage"]["prompt_tokens"] == 3 + 2 * 16  # placeholders expanded
    assert got["usage"]["completion_tokens"] == 5
    # streamed, with usage, and without max_tokens (the default fits the expanded prompt)
    body = {"messages": [{"role": "user", "content": [image_part(data_url(a))]}],
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert events[-1]["usage"]["prompt_tokens"] == 16


@pytest.mark.parametrize("url,message", [
    ("https://evil.test/cat.png", "not in --allowed-media-domains"),
    ("https://img.example.com/cat.png", "does not fetch remote media"),
    ("data:image/png;base64,AAAA", "not a PNG or JPEG"),
    ("data:image/gif;base64,AAAA", "media type 'image/gif'"),
])
def test_refused_image_urls_are_400s(server, url, message):
    srv, _ = server
    r = chat(srv, [{"type": "text", "text": "w5"}, image_part(url)])
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    ok = chat(srv, [{"type": "text", "text": "w5 w6"}])  # the server carries on
    assert ok.status_code == 200


def test_too_large_and_too_many_images_are_400s(server):
    srv, _ = server
    big = random_image(3, (200, 200))
    r = chat(srv, [image_part(data_url(big))])
    assert r.status_code == 400 and "max_image_bytes = 50000" in r.text, r.text
    small = data_url(random_image(4, (8, 8)))
    r = chat(srv, [image_part(small)] * 5)
    assert r.status_code == 400 and "max_images_per_prompt = 4" in r.text, r.text


def test_a_tokenizer_larger_than_the_decoder_vocabulary_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    from pagedllm.model import CheckpointError
    from pagedllm.tokenizer import Tokenizer as PagedTokenizer

    path = write_tiny_llava(str(tmp_path))
    vocab = {f"w{i}": i for i in range(VOCAB + 10)}  # ids past text_config.vocab_size
    Tokenizer(models.WordLevel(vocab, unk_token="w0")).save(os.path.join(path, "tokenizer.json"))
    with pytest.raises(CheckpointError, match="vocab"):
        PagedTokenizer.from_dir(path)


def test_allowed_media_domains_flag():
    import argparse

    from pagedllm.server.cli_args import add_policy_arguments, policy_settings

    parser = argparse.ArgumentParser()
    add_policy_arguments(parser)
    args = parser.parse_args(["--allowed-media-domains", "example.com, cdn.test"])
    assert policy_settings(args)["allowed_media_domains"] == ("example.com", "cdn.test")
    assert policy_settings(parser.parse_args([]))["allowed_media_domains"] == ()
