"""Streaming attention frees the blocks that leave its window: a 10k-token generation on a tiny
random model holds a bounded number of blocks (in a pool far smaller than the sequence), forks
keep their shared blocks, prefix caching still serves the dense prompt part, nothing leaks."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=32, vocab_size=64, max_position_embeddings=16384)
CFG = {"strategy": "streaming", "sink_blocks": 1, "local_blocks": 3}


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory) -> str:
    from pagedllm.model import write_random_checkpoint

    path = tmp_path_factory.mktemp("long_model")
    write_random_checkpoint(path, preset=TINY, seed=7, initializer_range=0.1)
    return str(path)


def _llm(path, blocks):
    return LLM(path, block_size=16, num_kv_blocks=blocks, sparse_attention=CFG,
               enable_prefix_caching=True)


def test_10k_tokens_in_bounded_blocks(long_model_dir):
    llm = _llm(long_model_dir, 24)  # 384 token slots for a 10040-token sequence
    prompt = list(range(3, 43))  # 40 tokens: 3 blocks
    out = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 10_000
    stats = llm.kv_cache_stats()
    # sink + window + the block being filled (+1 while a new block opens before the drop)
    assert stats["peak_used_blocks"] <= CFG["sink_blocks"] + CFG["local_blocks"] + 2
    assert stats["sparse_blocks_dropped"] >= (10_040 // 16) - 6
    assert stats["sparse_blocks_held_last_step"] <= CFG["sink_blocks"] + CFG["local_blocks"] + 1
    assert stats["used_blocks"] == 0


def test_forks_keep_shared_blocks_and_prefix_cache_serves_the_prompt(long_model_dir):
    llm = _llm(long_model_dir, 64)
    prompt = [3 + i % 60 for i in range(80)]  # 5 full blocks
    params = SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=300, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs
    assert [len(o.token_ids) for o in outs] == [300, 300]
    assert llm.kv_cache_stats()["used_blocks"] == 0
    # the dropped full prompt blocks were parked in the prefix cache: a second request hits
    before = llm.kv_cache_stats()["prefix_cache_hits"]
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=2), use_tqdm=False)
    assert llm.kv_cache_stats()["prefix_cache_hits"] - before >= 64
    assert llm.kv_cache_stats()["used_blocks"] == 0
