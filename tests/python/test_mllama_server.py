"""The OpenAI chat route on an Mllama model: `image_url` parts become `<|image|>` tokens (not
expanded) and give transformers' greedy tokens; bad images are 400s and the server carries on."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from mllama_fixtures import IMAGE_TOKEN, hf_greedy, random_image, write_test_checkpoint
from server_fixtures import serve_tiny_model
from test_mm_server import chat, data_url, image_part


def write_word_tokenizer(path: str) -> None:
    """A whitespace word-level tokenizer: w3..w255 are ids 3..255, <|image|> is IMAGE_TOKEN
    (past the vocabulary, as in Llama 3.2 Vision)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, IMAGE_TOKEN)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens([AddedToken("<|image|>", normalized=False)])
    assert tk.token_to_id("<|image|>") == IMAGE_TOKEN
    tk.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "</s>",
                   "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}, f)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_test_checkpoint(str(tmp_path_factory.mktemp("mllama_chat")))
    write_word_tokenizer(path)
    with serve_tiny_model(path, num_kv_blocks=128, num_cross_kv_blocks=32, block_size=4) as srv:
        yield srv, path


def test_chat_with_images_matches_transformers(server):
    srv, path = server
    a, b = random_image(1, (40, 20)), random_image(2, (14, 14))
    r = chat(srv, [image_part(data_url(a)), image_part(data_url(b)),
                   {"type": "text", "text": "w5 w6 w7"}],
             logprobs=True, return_tokens_as_token_ids=True)
    assert r.status_code == 200, r.text
    got = r.json()
    tokens = [int(t["token"].split(":")[1]) for t in got["choices"][0]["logprobs"]["content"]]
    assert tokens == hf_greedy(path, [IMAGE_TOKEN, IMAGE_TOKEN, 5, 6, 7], [a, b], 5)[0]
    assert got["usage"]["prompt_tokens"] == 5  # one <|image|> token per image


def test_text_prompt_with_the_image_token_through_generate(server):
    # LLM.generate's form: the prompt text names <|image|>, the images come beside it
    from pagedllm import LLM, SamplingParams

    _, path = server

    llm = LLM(path, num_kv_blocks=64, num_cross_kv_blocks=16, block_size=4)
    img = random_image(3, (18, 37))
    (out,) = llm.generate([{"prompt": "<|image|> w9 w10", "multi_modal_data": {"image": img}}],
                          SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                          use_tqdm=False)
    assert out.prompt_token_ids == [IMAGE_TOKEN, 9, 10]
    assert out.outputs[0].token_ids == hf_greedy(path, [IMAGE_TOKEN, 9, 10], [img], 4)[0]


def test_bad_image_is_a_400_and_the_server_carries_on(server):
    srv, _ = server
    r = chat(srv, [image_part("data:image/png;base64,AAAA"), {"type": "text", "text": "w5"}])
    assert r.status_code == 400 and "not a PNG or JPEG" in r.json()["error"]["message"], r.text
    ok = chat(srv, [{"type": "text", "text": "w5 w6"}])
    assert ok.status_code == 200, ok.text
