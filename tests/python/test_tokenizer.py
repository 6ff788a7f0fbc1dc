"""Tokenizer: special ids from the checkpoint files, bos handling, streaming detokenization."""

import json

import pytest

from model_fixtures import write_byte_level_tokenizer, write_sentencepiece_style_tokenizer
from pagedllm.tokenizer import Tokenizer

TEXT = " hello the wörld 🙂 中文, ok!"
KINDS = {"byte_level": write_byte_level_tokenizer, "sentencepiece": write_sentencepiece_style_tokenizer}


@pytest.fixture(params=sorted(KINDS))
def tok_dir(request, tmp_path):
    KINDS[request.param](tmp_path)
    return tmp_path


def test_round_trip_and_bos_added_once(tok_dir):
    tok = Tokenizer.from_dir(tok_dir)
    ids = tok.encode(TEXT.strip())
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.encode(TEXT.strip(), add_special_tokens=False) == ids[1:]
    assert tok.decode(ids) == TEXT.strip()
    assert tok.decode(ids, skip_special_tokens=False) != TEXT.strip()


def test_special_ids_merge_every_source(tmp_path):
    write_sentencepiece_style_tokenizer(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 9, "bos_token_id": 1}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.eos_token_ids == (2, 7, 9)   # tokenizer_config's "</s>" first, no duplicates
    assert tok.bos_token_id == 1 == tok.token_to_id("<s>")


@pytest.mark.parametrize("prompt", ["", "the prompt"])
def test_streaming_emits_only_whole_characters_and_adds_up(tok_dir, prompt):
    tok = Tokenizer.from_dir(tok_dir)
    prompt_ids = tok.encode(prompt) if prompt else []
    gen = tok.encode(TEXT, add_special_tokens=False)
    det = tok.detokenizer(prompt_ids)
    deltas = [det.add(i) for i in gen]
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # multi-byte characters split across tokens were held back
    assert "🙂" in deltas and "中" in deltas
    expected = tok.decode(prompt_ids + gen)[len(tok.decode(prompt_ids)):]
    assert "".join(deltas) == det.text == expected
    assert det.flush() == ""


def test_streaming_skips_special_tokens_and_flushes_a_cut_character(tmp_path):
    write_byte_level_tokenizer(tmp_path)
    tok = Tokenizer.from_dir(tmp_path)
    eos = tok.eos_token_ids[0]
    det = tok.detokenizer(tok.encode("the"))
    assert det.add(eos) == ""
    emoji = tok.encode("🙂", add_special_tokens=False)
    assert len(emoji) > 1
    assert [det.add(i) for i in emoji[:-1]] == [""] * (len(emoji) - 1)
    assert "\ufffd" in det.flush()  # generation stopped mid-character: the rest, as is

    det = tok.detokenizer(tok.encode("the"), skip_special_tokens=False)
    assert det.add(eos) == "<|end|>"


def test_missing_or_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    write_byte_level_tokenizer(tmp_path)
    (tmp_path / "generation_config.json").write_text("[")
    with pytest.raises(ValueError, match="generation_config.json"):
        Tokenizer.from_dir(tmp_path)
