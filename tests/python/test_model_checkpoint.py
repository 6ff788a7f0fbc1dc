"""write_random_checkpoint: the Hugging Face layout transformers reads, deterministic weights."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from pagedllm.model import PRESETS, random_config, write_random_checkpoint
from pagedllm.model.weight_names import expected_tensors

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=128)


def _all_tensors(path):
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f)))
    return out


def test_layout_and_files(tmp_path):
    config = write_random_checkpoint(tmp_path, SHAPE, num_shards=3, tie_word_embeddings=True)
    files = sorted(os.listdir(tmp_path))
    assert files == ["config.json", "generation_config.json", "model-00001-of-00003.safetensors",
                     "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                     "model.safetensors.index.json"]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    tensors = _all_tensors(tmp_path)
    assert set(index["weight_map"]) == set(tensors) == set(expected_tensors(config))
    assert "lm_head.weight" not in tensors
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in tensors.values())
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "float32"
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1


def test_weights_depend_on_seed_only(tmp_path):
    write_random_checkpoint(tmp_path / "a", SHAPE, seed=1)
    write_random_checkpoint(tmp_path / "b", SHAPE, seed=1, num_shards=4)
    write_random_checkpoint(tmp_path / "c", SHAPE, seed=2)
    write_random_checkpoint(tmp_path / "d", SHAPE, seed=1, dtype=torch.float16)
    a, b, c, d = (_all_tensors(tmp_path / x) for x in "abcd")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert all(d[k].dtype == torch.float16 and torch.equal(d[k], a[k].half()) for k in a)


def test_initialisation_statistics(tmp_path):
    write_random_checkpoint(tmp_path, SHAPE, initializer_range=0.05)
    t = _all_tensors(tmp_path)
    w = t["model.layers.0.mlp.gate_proj.weight"]
    assert abs(float(w.std()) - 0.05) < 0.005 and abs(float(w.mean())) < 0.005
    n = t["model.layers.0.input_layernorm.weight"]
    assert abs(float(n.mean()) - 1.0) < 0.02 and 0.02 < float(n.std()) < 0.08


def test_transformers_loads_it(tmp_path):
    from transformers import LlamaForCausalLM

    write_random_checkpoint(tmp_path, SHAPE, num_shards=2, attention_bias=True,
                            rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64})
    hf = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    tensors = _all_tensors(tmp_path)
    hf_state = hf.state_dict()
    assert all(torch.equal(hf_state[k], v) for k, v in tensors.items())
    assert hf.config.rope_parameters["rope_type"] == "llama3"


def test_presets_and_argument_checks(tmp_path):
    assert set(PRESETS) == {"tiny", "small", "1b"}
    one_b = random_config("1b")  # Llama-3.2-1B's shape
    assert one_b.tie_word_embeddings and one_b.rope_scaling.rope_type == "llama3"
    assert 1.23e9 < one_b.num_parameters() < 1.24e9
    assert random_config("tiny", num_key_value_heads=1).num_key_value_heads == 1
    with pytest.raises(ValueError, match="num_shards"):
        write_random_checkpoint(tmp_path, SHAPE, num_shards=0)
    with pytest.raises(ValueError, match="dtype"):
        write_random_checkpoint(tmp_path, SHAPE, dtype=torch.int8)
