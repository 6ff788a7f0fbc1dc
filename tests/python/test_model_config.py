"""ModelConfig parsing: both config.json dialects, defaults, derived sizes, clear rejections."""

import json

import pytest

from pagedllm.model import CheckpointError, ModelConfig, RopeScaling, random_config

BASE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_defaults_follow_transformers():
    c = ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "num_key_value_heads"})
    assert c.num_key_value_heads == 4 and c.head_dim == 32 and c.num_kv_groups == 1
    assert c.rms_norm_eps == 1e-6 and c.rope_theta == 10000.0 and c.rope_scaling is None
    assert c.max_position_embeddings == 2048 and not c.tie_word_embeddings
    assert not c.attention_bias and not c.mlp_bias
    assert c.q_size == 128 and c.kv_size == 128


def test_explicit_head_dim_and_mqa():
    c = ModelConfig.from_dict({**BASE, "head_dim": 64, "num_key_value_heads": 1})
    assert c.head_dim == 64 and c.q_size == 256 and c.kv_size == 64 and c.num_kv_groups == 4


@pytest.mark.parametrize("rope", [
    {"rope_theta": 500000.0, "rope_scaling": LLAMA3},                        # legacy, rope_type
    {"rope_theta": 500000.0, "rope_scaling": {**LLAMA3, "type": "llama3"}},  # legacy, type
    {"rope_parameters": {**LLAMA3, "rope_theta": 500000.0}},                  # transformers 5
])
def test_llama3_rope_in_every_dialect(rope):
    c = ModelConfig.from_dict({**BASE, **rope})
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


def test_linear_rope_and_default_original_max_positions():
    c = ModelConfig.from_dict({**BASE, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert c.rope_scaling == RopeScaling("linear", 2.0)
    d = {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}
    c = ModelConfig.from_dict({**BASE, "max_position_embeddings": 4096, "rope_scaling": d})
    assert c.rope_scaling.original_max_position_embeddings == 4096


def test_eos_ids_generation_config_wins_and_lists_accepted():
    c = ModelConfig.from_dict({**BASE, "eos_token_id": 2, "bos_token_id": 1},
                              {"eos_token_id": [2, 7]})
    assert c.eos_token_ids == (2, 7) and c.bos_token_id == 1
    assert ModelConfig.from_dict({**BASE, "eos_token_id": None}).eos_token_ids == ()


def test_hf_dict_round_trip_and_transformers_accepts_it():
    from transformers import LlamaConfig

    c = random_config("tiny", rope_scaling=LLAMA3, tie_word_embeddings=True, head_dim=64,
                      attention_bias=True, eos_token_id=[2, 3])
    d = c.to_hf_dict()
    assert ModelConfig.from_dict(json.loads(json.dumps(d))) == c
    hf = LlamaConfig(**d)
    assert hf.head_dim == 64 and hf.rope_parameters["rope_type"] == "llama3"
    assert hf.tie_word_embeddings and hf.attention_bias


@pytest.mark.parametrize("change, words", [
    ({"architectures": ["MistralForCausalLM"]}, "architectures"),
    ({"model_type": "gpt2"}, "model_type"),
    ({"hidden_size": None}, "hidden_size"),
    ({"vocab_size": "1000"}, "vocab_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
    ({"rope_scaling": {"rope_type": "linear"}}, "factor"),
    ({"rope_scaling": {**LLAMA3, "high_freq_factor": 1.0}}, "high_freq_factor"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"head_dim": 33}, "head_dim"),
    ({"eos_token_id": 5000}, "5000"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    # was accepted, then every quantized tensor refused as an odd dtype or name
    ({"quantization_config": {"quant_method": "fp8"}}, "quantized checkpoints are not supported"),
    ({"hidden_act": ["silu"]}, "hidden_act"),
])
def test_bad_configs_are_refused_naming_the_field(tmp_path, change, words):
    d = {**BASE, **change}
    d = {k: v for k, v in d.items() if v is not None or k in ("rope_scaling",)}
    with pytest.raises(ValueError, match=words):
        ModelConfig.from_dict(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="config.json") as e:
        ModelConfig.from_dir(tmp_path)
    assert words in str(e.value)


def test_hidden_not_divisible_without_head_dim():
    with pytest.raises(ValueError, match="not a multiple of num_attention_heads"):
        ModelConfig.from_dict({**BASE, "hidden_size": 130})
    assert ModelConfig.from_dict({**BASE, "hidden_size": 130, "head_dim": 32}).head_dim == 32


def test_missing_or_broken_config_file(tmp_path):
    with pytest.raises(CheckpointError, match="config.json: file not found"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot be read as JSON"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        ModelConfig.from_dir(tmp_path)


def test_preset_sizes():
    assert random_config("small").num_parameters() == 155_730_944
    tiny = random_config("tiny")
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.num_attention_heads,
            tiny.num_key_value_heads, tiny.intermediate_size, tiny.vocab_size) == (
        256, 4, 8, 2, 688, 4096)
    with pytest.raises(ValueError, match="unknown preset"):
        random_config("huge")


def test_swish_is_silu_as_in_transformers():
    assert ModelConfig.from_dict({**BASE, "hidden_act": "swish"}).hidden_act == "silu"
    assert ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "hidden_act"}).hidden_act == "silu"
