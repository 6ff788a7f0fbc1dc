"""LlamaForCausalLM.forward / compute_logits: contract checks beyond parity (test_model_parity)."""

import pytest
import torch

from model_fixtures import prefill_meta, torch_one_thread  # noqa: F401  (fixture)
from pagedllm.model import (PagedKVCache, load_model, random_config,
                            write_random_checkpoint)

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=128)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = tmp_path_factory.mktemp("fwd")
    write_random_checkpoint(path, SHAPE, seed=1)
    return load_model(path)


def test_outputs_and_cache_writes(loaded):
    model, config = loaded
    kv = PagedKVCache(config, 4, 16)
    ids = torch.randint(0, config.vocab_size, (20,))
    hidden = model(ids, torch.arange(20), prefill_meta(20), kv)
    assert hidden.shape == (20, config.hidden_size) and hidden.dtype == torch.float32
    assert not hidden.requires_grad
    logits = model.compute_logits(hidden[-1:])
    assert logits.shape == (1, config.vocab_size) and logits.dtype == torch.float32
    # the 20 tokens' keys landed in blocks 0 and 1 of every layer, nothing else was written
    for layer in range(config.num_hidden_layers):
        k = kv.key_cache(layer)
        assert bool(k[0].abs().sum(-1).gt(0).all()) and bool(k[1, :, :4].abs().sum(-1).gt(0).all())
        assert bool((k[1, :, 4:] == 0).all()) and bool((k[2:] == 0).all())


def test_contract_violations_are_refused(loaded):
    model, config = loaded
    kv = PagedKVCache(config, 4, 16)
    ids = torch.randint(0, config.vocab_size, (5,))
    with pytest.raises(ValueError, match="num_tokens"):
        model(ids, torch.arange(4), prefill_meta(5), kv)
    with pytest.raises(ValueError, match="num_tokens"):
        model(ids, torch.arange(5), prefill_meta(6), kv)
    other = PagedKVCache(random_config(SHAPE, num_hidden_layers=3), 4, 16)
    with pytest.raises(ValueError, match="3 layers"):
        model(ids, torch.arange(5), prefill_meta(5), other)
    # the kernels check the metadata against the pool (block id outside it)
    meta = prefill_meta(5)
    meta.block_tables[0, 0] = 9
    with pytest.raises((ValueError, IndexError)):
        model(ids, torch.arange(5), meta, kv)
