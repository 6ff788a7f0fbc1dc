"""PagedKVCache layout, sizing and block copies; AttentionMetadata validation."""

import pytest
import torch

from pagedllm.model import AttentionMetadata, PagedKVCache, random_config

CONFIG = random_config(dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=96, vocab_size=128))


def test_pool_layout_is_block_major_with_per_layer_views():
    kv = PagedKVCache(CONFIG, num_blocks=5, block_size=4)
    assert kv.pool.shape == (5, 3, 2, 2, 4, 16) and kv.pool.dtype == torch.float32
    kc, vc = kv.key_cache(1), kv.value_cache(1)
    assert kc.shape == vc.shape == (5, 2, 4, 16)
    assert kc.stride(0) == 3 * 2 * 2 * 4 * 16 and kc[0].is_contiguous()
    kc[3, 1, 2, 5] = 7.0
    vc[4, 0, 0, 0] = 9.0
    assert kv.pool[3, 1, 0, 1, 2, 5] == 7.0 and kv.pool[4, 1, 1, 0, 0, 0] == 9.0
    # one block, every layer, keys and values: one contiguous run
    assert kv.pool[2].is_contiguous()


@pytest.mark.parametrize("name, dtype, size", [
    ("auto", torch.float32, 4), ("fp32", torch.float32, 4), ("fp16", torch.float16, 2),
    ("bf16", torch.bfloat16, 2), ("fp8", torch.uint8, 1), ("fp8_e5m2", torch.uint8, 1)])
def test_storage_dtypes_and_bytes_per_block(name, dtype, size):
    kv = PagedKVCache(CONFIG, 3, 16, kv_cache_dtype=name)
    assert kv.pool.dtype == dtype
    per_block = PagedKVCache.bytes_per_block(CONFIG, 16, name)
    assert per_block == 3 * 2 * 2 * 16 * 16 * size
    assert kv.nbytes == 3 * per_block


def test_bad_arguments():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        PagedKVCache(CONFIG, 3, 16, kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(CONFIG, 0, 16)
    with pytest.raises(ValueError, match="scale"):
        PagedKVCache(CONFIG, 3, 16, kv_cache_dtype="fp8", k_scale=0.0)


@pytest.mark.parametrize("kv_dtype", ["auto", "bf16", "fp8"])
def test_copy_blocks_copies_whole_blocks_across_layers(kv_dtype):
    kv = PagedKVCache(CONFIG, num_blocks=6, block_size=2, kv_cache_dtype=kv_dtype)
    kv.pool.copy_(torch.randint(0, 100, kv.pool.shape))
    before = kv.pool.clone()
    kv.copy_blocks(torch.tensor([[1, 4], [2, 5]], dtype=torch.int32))
    assert torch.equal(kv.pool[4], before[1]) and torch.equal(kv.pool[5], before[2])
    assert torch.equal(kv.pool[:4], before[:4])
    kv.copy_blocks(torch.zeros(0, 2, dtype=torch.int32))  # nothing to do
    with pytest.raises((ValueError, IndexError)):
        kv.copy_blocks(torch.tensor([[1, 6]], dtype=torch.int32))
    assert torch.equal(kv.pool[:4], before[:4])


def _meta(**change):
    args = dict(slot_mapping=torch.arange(6, dtype=torch.int64),
                block_tables=torch.zeros(3, 2, dtype=torch.int32),
                context_lens=torch.tensor([4, 9, 3], dtype=torch.int32),
                cu_seqlens_q=torch.tensor([0, 1, 3, 6], dtype=torch.int32),
                num_decode_seqs=1)
    args.update(change)
    return AttentionMetadata(**args)


def test_metadata_splits_decode_and_prefill():
    m = _meta()
    assert (m.num_seqs, m.num_tokens, m.num_prefill_seqs) == (3, 6, 2)
    assert m.decode_context_lens.tolist() == [4]
    assert m.prefill_context_lens.tolist() == [9, 3]
    assert m.prefill_cu_seqlens_q.tolist() == [0, 2, 5]
    assert m.prefill_cu_seqlens_q.dtype == torch.int32
    assert _meta(num_decode_seqs=0).prefill_cu_seqlens_q.tolist() == [0, 1, 3, 6]


@pytest.mark.parametrize("change, words", [
    ({"block_tables": torch.zeros(3, 2, dtype=torch.int64)}, "block_tables"),
    ({"slot_mapping": torch.zeros(6, 1, dtype=torch.int64)}, "slot_mapping"),
    ({"context_lens": [4, 9, 3]}, "context_lens"),
    ({"block_tables": torch.zeros(2, 2, dtype=torch.int32)}, "rows"),
    ({"num_decode_seqs": 4}, "num_decode_seqs"),
    ({"num_decode_seqs": 2}, "cu_seqlens_q"),
    ({"cu_seqlens_q": torch.tensor([0, 1, 3, 5], dtype=torch.int32)}, "num_tokens"),
])
def test_metadata_rejects_inconsistent_input(change, words):
    with pytest.raises(ValueError, match=words):
        _meta(**change)
