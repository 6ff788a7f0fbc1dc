"""Diagnostics and tuning (issue 17): block_size="auto", the OOM table as errors and warnings,
the KV metrics behind it, numeric checks and timeline traces."""

from __future__ import annotations

import argparse
import logging

import pytest

from engine_fixtures import assert_pool_clean, engine_model_dir, mixed_prompts  # noqa: F401
from pagedllm import LLM, SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.engine.kv_sizing import GPU_BLOCK_SIZE_TABLE, resolve_block_size, seed_rule


def greedy(max_tokens=8):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def tok(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


# --- block_size="auto" --------------------------------------------------------------------------
@pytest.mark.parametrize("mean, expected", [(1, 16), (100, 16), (160, 16), (161, 32), (191, 32),
                                            (640, 64), (1000, 128), (2000, 256), (100000, 256)])
def test_auto_block_size_on_declared_lengths(mean, expected):
    cfg = EngineConfig(block_size="auto", expected_mean_seq_len=mean)
    bs, why = resolve_block_size(cfg, model_max_len=4096)
    assert bs == expected
    assert f"expected_mean_seq_len={mean}" in why
    if seed_rule(mean) > 256:
        assert "bounded to 256 by the kernels" in why


def test_auto_block_size_without_a_declared_length_uses_max_model_len_and_says_so():
    bs, why = resolve_block_size(EngineConfig(block_size="auto"), model_max_len=1024)
    assert bs == 128 and "max_model_len=1024" in why and "proxy" in why
    bs, why = resolve_block_size(EngineConfig(block_size="auto", max_model_len=300), 1024)
    assert bs == 32 and "max_model_len=300" in why


def test_auto_block_size_gpu_table_is_unmeasured_and_explicit_sizes_pass_through():
    assert GPU_BLOCK_SIZE_TABLE == {}  # nothing measured on a GPU yet: no copied numbers
    bs, why = resolve_block_size(EngineConfig(block_size="auto", expected_mean_seq_len=640),
                                 4096, gpu_arch="9.0")
    assert bs == 64 and "no measured GPU table entry" in why
    assert resolve_block_size(EngineConfig(block_size=8), 4096) == (8, "configured")


def test_auto_block_size_config_yaml_and_cli(tmp_path):
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size="big")
    with pytest.raises(ValueError, match="expected_mean_seq_len"):
        EngineConfig(block_size="auto", expected_mean_seq_len=0)
    path = tmp_path / "c.yaml"
    path.write_text("kv_cache:\n  block_size: auto\n  expected_mean_seq_len: 500\n")
    cfg = EngineConfig.from_yaml(str(path))
    assert cfg.block_size == "auto" and cfg.expected_mean_seq_len == 500
    from pagedllm.commands.common import add_engine_args, engine_config

    p = argparse.ArgumentParser()
    add_engine_args(p)
    cfg = engine_config(p.parse_args(["--block-size", "auto", "--expected-mean-seq-len", "300"]))
    assert cfg.block_size == "auto" and cfg.expected_mean_seq_len == 300
    assert engine_config(p.parse_args(["--block-size", "8"])).block_size == 8


def test_auto_block_size_in_the_engine(engine_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="pagedllm"):
        llm = LLM(engine_model_dir, block_size="auto", expected_mean_seq_len=300,
                  num_kv_blocks=32)
    assert any("block_size=auto" in r.getMessage() and "= 32" in r.getMessage()
               for r in caplog.records)
    stats = llm.kv_cache_stats()
    assert stats["block_size"] == 32 and "expected_mean_seq_len=300" in stats["block_size_reason"]
    assert llm.engine.config.block_size == "auto"
    outs = llm.generate(tok(mixed_prompts(4, seed=3, hi=40)), greedy(), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    # The same tokens as an explicit block size of 32.
    ref = LLM(engine_model_dir, block_size=32, num_kv_blocks=32)
    refs = ref.generate(tok(mixed_prompts(4, seed=3, hi=40)), greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in refs]
    assert_pool_clean(llm)
