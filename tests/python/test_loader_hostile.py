"""Hostile checkpoints (issue 20, defects 3 and 6): each is refused at load with a clear
CheckpointError, cheaply, and never hangs the loader."""

import json
import math
import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch
from safetensors.torch import load_file, save_file

from model_fixtures import write_sentencepiece_style_tokenizer
from pagedllm.model import CheckpointError, load_model, write_random_checkpoint
from pagedllm.model.generation_config import read_generation_defaults
from pagedllm.tokenizer import Tokenizer

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=512)
DEADLINE_S = 60  # "does not hang": far above what a refusal takes


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    write_random_checkpoint(path, SHAPE, seed=1)
    write_sentencepiece_style_tokenizer(path)
    return path


@pytest.fixture
def ckpt(good, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(good, dst)
    return dst


def _edit_json(path, name, **changes):
    p = os.path.join(path, name)
    d = json.loads(open(p).read())
    d.update(changes)
    with open(p, "w") as f:
        f.write(json.dumps(d))  # NaN and Infinity are written as JSON's extension, as HF does


def _with_head_dim(path, head_dim):
    """Rewrites the checkpoint for another head_dim, weights included (so only the kernel
    limit is wrong)."""
    heads, kvh, h = SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"], SHAPE["hidden_size"]
    tensors = load_file(os.path.join(path, "model.safetensors"))
    for i in range(SHAPE["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        tensors[p + "q_proj.weight"] = torch.randn(heads * head_dim, h) * 0.02
        tensors[p + "k_proj.weight"] = torch.randn(kvh * head_dim, h) * 0.02
        tensors[p + "v_proj.weight"] = torch.randn(kvh * head_dim, h) * 0.02
        tensors[p + "o_proj.weight"] = torch.randn(h, heads * head_dim) * 0.02
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    _edit_json(path, "config.json", head_dim=head_dim)


def _within_deadline(fn, unblock_fifo=None):
    """fn()'s exception (or None), failing the test if fn has not returned by the deadline.

    A loader that opens a FIFO blocks in open(); on a timeout the FIFO is opened for writing
    so that the stuck thread ends instead of lingering."""
    result = {}

    def target():
        try:
            fn()
            result["error"] = None
        except BaseException as e:  # noqa: BLE001 - reported to the test
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(DEADLINE_S)
    if t.is_alive():
        if unblock_fifo is not None:
            fd = os.open(unblock_fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        pytest.fail(f"{fn} did not return within {DEADLINE_S} s (it hangs)")
    return result["error"]


# --- defect 3: head_dim the kernels cannot run ---------------------------------------------------
@pytest.mark.parametrize("head_dim", [12, 20, 520])
def test_head_dim_the_kernels_do_not_support_is_refused(ckpt, head_dim):
    _with_head_dim(ckpt, head_dim)
    with pytest.raises(CheckpointError) as e:
        load_model(ckpt)
    msg = str(e.value)
    assert "config.json" in msg and f"head_dim = {head_dim}" in msg, msg
    assert "multiple of 8 in [8, 512]" in msg, msg


def test_supported_head_dim_with_rewritten_weights_loads(ckpt):
    _with_head_dim(ckpt, 24)  # the helper itself makes a loadable checkpoint
    _, config = load_model(ckpt)
    assert config.head_dim == 24


def test_cuda_head_dims_are_the_compiled_ones():
    from pagedllm.model.limits import head_dim_problem

    assert head_dim_problem(128, "cuda") is None and head_dim_problem(24) is None
    assert "one of 64, 80, 96, 128, 256" in head_dim_problem(24, "cuda")


def test_heads_not_a_multiple_of_kv_heads_is_refused(ckpt):
    _edit_json(ckpt, "config.json", num_key_value_heads=3, head_dim=16)
    with pytest.raises(CheckpointError, match="num_attention_heads = 4 is not a multiple of "
                                              "num_key_value_heads = 3"):
        load_model(ckpt)


# --- defect 6: absurd sizes, refused before anything is sized from them -------------------------
@pytest.mark.parametrize("field, value", [
    ("num_hidden_layers", 5000), ("hidden_size", 10 ** 9), ("vocab_size", 10 ** 12),
    ("intermediate_size", 10 ** 9), ("max_position_embeddings", 10 ** 12),
    ("num_attention_heads", 10 ** 6),
])
def test_absurd_dimension_is_refused_naming_it(ckpt, field, value):
    _edit_json(ckpt, "config.json", **{field: value})
    with pytest.raises(CheckpointError) as e:
        load_model(ckpt)
    msg = str(e.value)
    assert "config.json" in msg and field in msg and "expected at most" in msg, msg


@pytest.mark.parametrize("layers", [1_000_000_000, 10 ** 400])
def test_billion_layers_is_refused_in_a_bounded_process(ckpt, layers):
    # The regression exhausted memory building the expected-tensor table: run it where a
    # regression fails (address-space limit, deadline) instead of taking the machine down.
    _edit_json(ckpt, "config.json", num_hidden_layers=layers)
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "from pagedllm.model import CheckpointError, load_model\n"
        "try:\n"
        "    load_model(sys.argv[1])\n"
        "except CheckpointError as e:\n"
        "    print('REFUSED', e)\n")
    r = subprocess.run([sys.executable, "-c", script, str(ckpt)], capture_output=True, text=True,
                       timeout=DEADLINE_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("REFUSED") and "num_hidden_layers" in r.stdout, r.stdout


def test_config_far_larger_than_the_weights_gets_a_one_line_summary(ckpt):
    _edit_json(ckpt, "config.json", num_hidden_layers=1000)
    with pytest.raises(CheckpointError) as e:
        load_model(ckpt)
    msg = str(e.value)
    assert "config.json describes 9003 tensors" in msg, msg
    assert "the safetensors files hold 21 tensors" in msg and "num_hidden_layers=1000" in msg, msg
    assert "\n" not in msg


# --- defect 6: only regular files are read -------------------------------------------------------
@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.safetensors"])
def test_fifo_checkpoint_file_is_refused_not_waited_on(ckpt, name):
    fifo = os.path.join(ckpt, name)
    os.remove(fifo)
    os.mkfifo(fifo)
    error = _within_deadline(lambda: load_model(ckpt), unblock_fifo=fifo)
    assert isinstance(error, CheckpointError), repr(error)
    assert name in str(error) and "FIFO" in str(error) and "regular file" in str(error)


def test_fifo_shard_and_index_are_refused(tmp_path):
    path = tmp_path / "sharded"
    write_random_checkpoint(path, SHAPE, num_shards=2)
    shard = os.path.join(path, "model-00002-of-00002.safetensors")
    os.remove(shard)
    os.mkfifo(shard)
    error = _within_deadline(lambda: load_model(path), unblock_fifo=shard)
    assert isinstance(error, CheckpointError) and "model-00002-of-00002" in str(error)
    assert "FIFO" in str(error)
    index = os.path.join(path, "model.safetensors.index.json")
    os.remove(index)
    os.mkfifo(index)
    error = _within_deadline(lambda: load_model(path), unblock_fifo=index)
    assert isinstance(error, CheckpointError), repr(error)
    assert "index.json" in str(error) and "FIFO" in str(error)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json",
                                  "generation_config.json", "config.json"])
def test_fifo_tokenizer_file_is_refused_not_waited_on(ckpt, name):
    fifo = os.path.join(ckpt, name)
    os.remove(fifo)
    os.mkfifo(fifo)
    error = _within_deadline(lambda: Tokenizer.from_dir(ckpt), unblock_fifo=fifo)
    assert isinstance(error, ValueError), repr(error)
    assert name in str(error) and "FIFO" in str(error)


def test_device_named_config_is_refused(ckpt):
    os.remove(os.path.join(ckpt, "config.json"))
    os.symlink("/dev/zero", os.path.join(ckpt, "config.json"))
    error = _within_deadline(lambda: load_model(ckpt))
    assert isinstance(error, CheckpointError) and "device" in str(error), repr(error)


# --- defect 6: generation_config.json values -----------------------------------------------------
@pytest.mark.parametrize("change, words", [
    ({"temperature": -1}, "temperature = -1: expected a number >= 0"),
    ({"temperature": math.nan}, "temperature = nan: expected a finite number"),
    ({"temperature": math.inf}, "temperature = inf: expected a finite number"),
    ({"temperature": "hot"}, "temperature = 'hot'"),
    ({"top_p": 0}, "top_p = 0: expected a number in (0, 1]"),
    ({"top_p": 1.5}, "top_p = 1.5"),
    ({"top_k": -2}, "top_k = -2"),
    ({"top_k": 2.5}, "top_k = 2.5"),
    ({"top_k": 2 ** 63}, "top_k = 9223372036854775808"),
    ({"max_new_tokens": 10 ** 30}, "max_new_tokens = 1000000000000000000000000000000"),
    ({"min_p": 2}, "min_p = 2"),
    ({"repetition_penalty": 0}, "repetition_penalty = 0"),
    ({"max_new_tokens": 0}, "max_new_tokens = 0"),
    ({"do_sample": "yes"}, "do_sample = 'yes'"),
    ({"eos_token_id": [2, 99999]}, "eos_token_id = [2, 99999]: token id 99999 is outside the "
                                   "vocabulary [0, 512)"),
    ({"eos_token_id": -1}, "token id -1 is outside"),
    ({"bos_token_id": 512}, "bos_token_id = 512"),
])
def test_invalid_generation_config_is_refused_at_load(ckpt, change, words):
    _edit_json(ckpt, "generation_config.json", **change)
    with pytest.raises(CheckpointError) as e:
        load_model(ckpt)
    assert "generation_config.json" in str(e.value) and words in str(e.value), str(e.value)
    with pytest.raises(CheckpointError, match="generation_config.json"):
        read_generation_defaults(ckpt, vocab_size=512)


def test_generation_defaults_are_read_validated(ckpt):
    _edit_json(ckpt, "generation_config.json", temperature=0.7, top_p=0.9, top_k=100000,
               min_p=None, max_new_tokens=64, repetition_penalty=1, unknown_field=-5)
    assert read_generation_defaults(ckpt, vocab_size=512) == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 512, "repetition_penalty": 1.0,
        "max_tokens": 64}
    _edit_json(ckpt, "generation_config.json", do_sample=False)
    assert read_generation_defaults(ckpt, vocab_size=512)["temperature"] == 0.0
    os.remove(os.path.join(ckpt, "generation_config.json"))
    assert read_generation_defaults(ckpt, vocab_size=512) == {}
    load_model(ckpt)  # no generation_config.json is fine


def test_config_json_special_ids_outside_the_vocabulary_are_refused(ckpt):
    # generation_config.json's eos wins for the model, but the tokenizer stops on both
    _edit_json(ckpt, "config.json", eos_token_id=600)
    with pytest.raises(CheckpointError, match=r"eos_token_id = 600: token id 600 is outside"):
        load_model(ckpt)


# --- defect 6: a tokenizer that does not fit the model -----------------------------------------
def test_tokenizer_larger_than_the_model_vocabulary_is_refused(ckpt):
    tok = Tokenizer.from_dir(ckpt)  # ~340 ids in a 512-row model: padded vocab_size is fine
    assert tok.vocab_size < 512
    _edit_json(ckpt, "config.json", vocab_size=128)
    with pytest.raises(CheckpointError) as e:
        Tokenizer.from_dir(ckpt)
    msg = str(e.value)
    assert "tokenizer.json" in msg and "vocab_size = 128" in msg and "token ids up to" in msg, msg


def test_tokenizer_special_ids_outside_the_model_vocabulary_are_refused(ckpt):
    os.remove(os.path.join(ckpt, "generation_config.json"))
    _edit_json(ckpt, "config.json", eos_token_id=None)
    with open(os.path.join(ckpt, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [2, 700]}, f)
    with pytest.raises(CheckpointError, match=r"eos token id 700 is outside the model vocabulary "
                                              r"\[0, 512\)"):
        Tokenizer.from_dir(ckpt)


def test_engine_refuses_a_tokenizer_larger_than_the_model(ckpt, tmp_path):
    from pagedllm.config import EngineConfig
    from pagedllm.engine.llm_engine import LLMEngine

    LLMEngine(EngineConfig(model=str(ckpt), num_kv_blocks=8, num_threads=1))  # loads as is
    small = tmp_path / "small_vocab"  # weights and config agree on 128 rows; the tokenizer has ~340
    write_random_checkpoint(small, {**SHAPE, "vocab_size": 128})
    write_sentencepiece_style_tokenizer(small)
    with pytest.raises(CheckpointError, match="token ids up to"):
        LLMEngine(EngineConfig(model=str(small), num_kv_blocks=8, num_threads=1))
