"""load_model: what a good checkpoint gives, and a clear CheckpointError for every broken one."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedllm.model import CheckpointError, LlamaForCausalLM, load_model, write_random_checkpoint
from pagedllm.model.weight_names import expected_tensors

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=128)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    write_random_checkpoint(path, SHAPE, seed=3)
    return path


@pytest.fixture
def ckpt(good, tmp_path):
    """A fresh copy of the good checkpoint to break."""
    dst = tmp_path / "ckpt"
    shutil.copytree(good, dst)
    return dst


def _edit_weights(path, fn, fname="model.safetensors"):
    tensors = load_file(os.path.join(path, fname))
    fn(tensors)
    save_file(tensors, os.path.join(path, fname), metadata={"format": "pt"})


def _edit_config(path, **changes):
    p = os.path.join(path, "config.json")
    with open(p) as f:
        d = json.load(f)
    d.update(changes)
    with open(p, "w") as f:
        json.dump(d, f)


def test_parameters_hold_the_file_tensors_fused(good):
    model, config = load_model(good)
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert all(not p.requires_grad for p in model.parameters())
    t = load_file(os.path.join(good, "model.safetensors"))
    attn = model.layers[1].self_attn
    want_qkv = torch.cat([t[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv"])
    assert torch.equal(attn.qkv_proj.weight, want_qkv)
    want_gu = torch.cat([t[f"model.layers.1.mlp.{n}_proj.weight"] for n in ("gate", "up")])
    assert torch.equal(model.layers[1].mlp.gate_up_proj.weight, want_gu)
    assert torch.equal(model.lm_head_weight, t["lm_head.weight"])
    assert torch.equal(model.norm.weight, t["model.norm.weight"])
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1


@pytest.mark.parametrize("extra", [{}, {"attention_bias": True, "mlp_bias": True},
                                   {"tie_word_embeddings": True, "num_key_value_heads": 1}])
def test_expected_tensors_fill_every_parameter_row_exactly_once(extra):
    from pagedllm.model import random_config

    config = random_config(SHAPE, **extra)
    params = dict(LlamaForCausalLM(config).named_parameters())
    rows = {name: torch.zeros(p.shape[0], dtype=torch.int32) for name, p in params.items()}
    for slot in expected_tensors(config).values():
        assert tuple(params[slot.param].shape[1:]) == slot.shape[1:]
        rows[slot.param][slot.row_offset:slot.row_offset + slot.shape[0]] += 1
    assert all(bool((r == 1).all()) for r in rows.values())


def test_shards_and_half_precision_files_load_to_the_same_weights(good, tmp_path):
    write_random_checkpoint(tmp_path / "sharded", SHAPE, seed=3, num_shards=3)
    assert len([f for f in os.listdir(tmp_path / "sharded") if f.endswith(".safetensors")]) == 3
    write_random_checkpoint(tmp_path / "bf16", SHAPE, seed=3, dtype=torch.bfloat16)
    ref = dict(load_model(good)[0].named_parameters())
    sharded = dict(load_model(tmp_path / "sharded")[0].named_parameters())
    bf16 = dict(load_model(tmp_path / "bf16")[0].named_parameters())
    for name, p in ref.items():
        assert torch.equal(sharded[name], p)
        assert bf16[name].dtype == torch.float32
        assert torch.equal(bf16[name], p.bfloat16().float())


def test_tied_embeddings_and_tolerated_extras(ckpt):
    _edit_config(ckpt, tie_word_embeddings=True)
    # a tied checkpoint may still carry lm_head.weight equal to the embedding (skipped, as
    # transformers does) and old exports carry rotary_emb.inv_freq buffers
    _edit_weights(ckpt, lambda t: t.update({
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8),
        "lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    model, config = load_model(ckpt)
    assert config.tie_word_embeddings and model.lm_head is None
    assert model.lm_head_weight is model.embed_tokens.weight
    assert "lm_head.weight" not in dict(model.named_parameters())


def test_tied_config_with_a_different_lm_head_loads_it_untied(ckpt, caplog):
    # A fine-tune that kept a trained head under the base model's tied config: the embedding
    # was used as the head (every token differed from transformers'); transformers keeps the
    # file's head, with a warning, and so does pagedllm now.
    head = load_file(os.path.join(ckpt, "model.safetensors"))["lm_head.weight"]
    _edit_config(ckpt, tie_word_embeddings=True)
    with caplog.at_level("WARNING", logger="pagedllm"):
        model, config = load_model(ckpt, prepack=False)
    assert not config.tie_word_embeddings and model.lm_head is not None
    assert torch.equal(model.lm_head.weight, head)
    assert any("differs from 'model.embed_tokens.weight'" in r.getMessage() for r in caplog.records)


def _drop(name):
    return lambda t: t.pop(name)


def _put(name, value):
    return lambda t: t.update({name: value})


# (weights edit, config edit, words the message must contain)
BROKEN = {
    "missing tensor": (_drop("model.layers.1.mlp.up_proj.weight"), {},
                       ["missing tensor 'model.layers.1.mlp.up_proj.weight'", "model.safetensors"]),
    "unexpected tensor": (_put("model.layers.0.self_attn.q_norm.weight", torch.ones(16)), {},
                          ["model.safetensors", "unexpected tensor 'model.layers.0.self_attn.q_norm.weight'"]),
    "extra layer": (None, {"num_hidden_layers": 1},
                    ["unexpected tensor 'model.layers.1.", "num_hidden_layers = 1"]),
    "wrong shape": (lambda t: t.update({"model.layers.0.self_attn.o_proj.weight":
                                        t["model.layers.0.self_attn.o_proj.weight"].t().contiguous()[:32]}),
                    {}, ["'model.layers.0.self_attn.o_proj.weight' has shape [32, 64], expected [64, 64]"]),
    "unusable dtype": (_put("model.norm.weight", torch.ones(64, dtype=torch.int8)), {},
                       ["'model.norm.weight' has dtype I8", "F32, F16, BF16"]),
    "hidden size contradicts weights": (None, {"hidden_size": 128},
                                        ["do not match config.json", "hidden_size=128",
                                         "'model.embed_tokens.weight' has shape [128, 64], expected [128, 128]"]),
    "head_dim contradicts weights": (None, {"head_dim": 32},
                                     ["'model.layers.0.self_attn.q_proj.weight' has shape [64, 64], "
                                      "expected [128, 64]"]),
    "biases missing": (None, {"attention_bias": True},
                       ["missing tensor 'model.layers.0.self_attn.q_proj.bias'", "attention_bias = true"]),
    "biases unexpected": (_put("model.layers.0.mlp.down_proj.bias", torch.zeros(64)), {},
                          ["unexpected tensor 'model.layers.0.mlp.down_proj.bias'", "mlp_bias = false"]),
    "untied without lm_head": (_drop("lm_head.weight"), {},
                               ["missing tensor 'lm_head.weight'", "tie_word_embeddings = false"]),
    "non-finite weight": (lambda t: t["model.layers.1.mlp.down_proj.weight"].view(-1).__setitem__(5, float("nan")),
                          {}, ["model.safetensors", "'model.layers.1.mlp.down_proj.weight' contains NaN"]),
    "unsupported architecture": (None, {"architectures": ["Qwen2ForCausalLM"]},
                                 ["config.json", "Qwen2ForCausalLM", "LlamaForCausalLM"]),
    "unsupported rope": (None, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
                         ["config.json", "'yarn' is not supported", "llama3"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_checkpoint_is_refused_clearly(ckpt, case):
    weights_edit, config_edit, words = BROKEN[case]
    if weights_edit:
        _edit_weights(ckpt, weights_edit)
    if config_edit:
        _edit_config(ckpt, **config_edit)
    with pytest.raises(CheckpointError) as e:
        load_model(ckpt)
    assert isinstance(e.value, ValueError)
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("damage", ["truncate", "garbage header", "empty"])
def test_corrupt_file_is_refused_naming_it(ckpt, damage):
    p = os.path.join(ckpt, "model.safetensors")
    data = open(p, "rb").read()
    new = {"truncate": data[:-100], "garbage header": b"\x20" + b"\x00" * 7 + b"{oops" + data[13:],
           "empty": b""}[damage]
    open(p, "wb").write(new)
    with pytest.raises(CheckpointError, match="model.safetensors: not a valid safetensors file"):
        load_model(ckpt)


def test_sharded_index_problems(tmp_path):
    path = tmp_path / "sharded"
    write_random_checkpoint(path, SHAPE, num_shards=2)
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())

    # a tensor listed under the wrong shard
    bad = json.loads(json.dumps(index))
    bad["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(bad))
    with pytest.raises(CheckpointError, match="lists 'model.norm.weight' in .*model-00001-of-00002"):
        load_model(path)

    # a shard that is not there
    os.rename(path / "model-00002-of-00002.safetensors", path / "moved.safetensors")
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="lists shard 'model-00002-of-00002.safetensors', which is not a file"):
        load_model(path)

    # a tensor the index does not know
    os.rename(path / "moved.safetensors", path / "model-00002-of-00002.safetensors")
    del index["weight_map"]["model.norm.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="'model.norm.weight' is not listed in model.safetensors.index.json"):
        load_model(path)


def test_directory_problems(ckpt, tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_model(tmp_path / "nowhere")
    os.remove(ckpt / "model.safetensors")
    (ckpt / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match="pickle checkpoints are refused"):
        load_model(ckpt)
    with pytest.raises(ValueError, match="dtype"):
        load_model(ckpt, dtype=torch.float64)
