"""pagedllm's Mllama decoder against transformers' MllamaForConditionalGeneration, vision states
given directly (no vision encoder): cross K/V written into paged cross blocks, the per-token
ranges from `<|image|>` positions; plus the range computation against transformers' processor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedllm.model import AttentionMetadata, PagedKVCache
from pagedllm.model.cross_attention import CrossAttentionMetadata
from pagedllm.model.mllama import MllamaForConditionalGeneration
from pagedllm.model.mllama_config import MllamaConfig
from pagedllm.multimodal.mllama_ranges import cross_token_ranges

from mllama_fixtures import (IMAGE_TOKEN, MAX_TILES, NUM_PATCHES, engine_test_config,
                             hf_token_mask,
                             load_text_weights, tiny_hf_model,
                             token_ranges)

BS = 4


@pytest.fixture(scope="module")
def models():
    hf = tiny_hf_model(0)
    cfg = MllamaConfig.from_dict(hf.config.to_dict())
    ours = MllamaForConditionalGeneration(cfg, torch.float32)
    load_text_weights(ours, hf, cfg)
    return hf, cfg, ours.eval()


def _ours_logits(cfg, ours, ids, states, num_tiles):
    """Prefill `ids` in one step with the images' valid-tile states in cross blocks."""
    n = len(ids)
    kv = PagedKVCache(cfg.self_text, 16, BS)
    cross_kv = PagedKVCache(cfg.cross_text, 16, BS)
    valid = [states[i, :t].reshape(-1, states.shape[-1]) for i, t in enumerate(num_tiles)]
    c = sum(v.shape[0] for v in valid)
    if c:
        ours.write_cross_kv(torch.cat(valid), torch.arange(c, dtype=torch.int64), cross_kv)
    nb = max(1, -(-c // BS))
    cross = None if not c else CrossAttentionMetadata(
        kv=cross_kv, block_tables=torch.arange(nb, dtype=torch.int32)[None],
        context_lens=torch.tensor([c], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
        kv_ranges=torch.from_numpy(cross_token_ranges(ids, IMAGE_TOKEN,
                                                      [v.shape[0] for v in valid])))
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64),
        block_tables=torch.arange(-(-n // BS), dtype=torch.int32)[None],
        context_lens=torch.tensor([n], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32), num_decode_seqs=0)
    ids_t = torch.tensor(ids, dtype=torch.int64)
    hidden = ours(ids_t, torch.arange(n), meta, kv, cross)
    return ours.compute_logits(hidden)


def _hf_logits(hf, ids, states, num_tiles):
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        if not num_tiles:
            return hf(input_ids=ids_t).logits[0]
        mask = hf_token_mask(ids, num_tiles)
        flat = states.reshape(1, -1, states.shape[-1])  # [1, images * max_tiles * patches, h]
        return hf(input_ids=ids_t, cross_attention_states=flat,
                  cross_attention_mask=mask).logits[0]


CASES = {
    "text_only": ([1, 5, 9, 20, 33, 7], []),
    "one_image": ([IMAGE_TOKEN, 1, 5, 9, 20, 33, 7, 40, 41], [2]),
    "two_consecutive": ([IMAGE_TOKEN, IMAGE_TOKEN, 1, 5, 9, 20, 33], [1, 2]),
    "two_apart": ([IMAGE_TOKEN, 1, 5, 9, IMAGE_TOKEN, 20, 33, 7, 8], [2, 1]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_decoder_matches_transformers(models, case):
    hf, cfg, ours = models
    ids, num_tiles = CASES[case]
    torch.manual_seed(1)
    states = torch.randn(len(num_tiles), MAX_TILES, NUM_PATCHES, cfg.text.hidden_size)
    want = _hf_logits(hf, ids, states, num_tiles)
    got = _ours_logits(cfg, ours, ids, states, num_tiles)
    # rows from the first image on (before it transformers averages over all vision tokens)
    first = ids.index(IMAGE_TOKEN) if IMAGE_TOKEN in ids else 0
    torch.testing.assert_close(got[first:], want[first:], atol=2e-4, rtol=2e-4)
    assert torch.equal(got[first:].argmax(-1), want[first:].argmax(-1))
    if num_tiles:  # the images move the logits (the test would not see a dropped layer)
        plain = _ours_logits(cfg, ours, ids, states, [])
        assert (plain[first:] - got[first:]).abs().max() > 1e-2


def test_padded_tiles_are_not_read(models):
    hf, cfg, ours = models
    ids, num_tiles = CASES["two_apart"]
    torch.manual_seed(2)
    states = torch.randn(2, MAX_TILES, NUM_PATCHES, cfg.text.hidden_size)
    base = _ours_logits(cfg, ours, ids, states, num_tiles)
    states[1, 1:] = 1e3  # image 1 has 1 valid tile: its padded tile must not matter
    torch.testing.assert_close(_ours_logits(cfg, ours, ids, states, num_tiles), base)


@pytest.mark.parametrize("ids", [
    [IMAGE_TOKEN, 3, 4, 5],
    [3, IMAGE_TOKEN, 4, IMAGE_TOKEN, 5, 6],
    [IMAGE_TOKEN, IMAGE_TOKEN, 3, IMAGE_TOKEN, 4, IMAGE_TOKEN, IMAGE_TOKEN, 5, 6],
    [3, 4, IMAGE_TOKEN],
])
def test_ranges_match_the_processor_mask(ids):
    n = ids.count(IMAGE_TOKEN)
    per_image = [5 * (k + 1) for k in range(n)]
    got = cross_token_ranges(ids, IMAGE_TOKEN, per_image)
    assert got.dtype == np.int32 and got.tolist() == token_ranges(ids, per_image)


def test_ranges_count_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"2 <\|image\|> token\(s\).*1 image\(s\)"):
        cross_token_ranges([IMAGE_TOKEN, 1, IMAGE_TOKEN], IMAGE_TOKEN, [5])


def test_config_errors_name_the_field(models):
    _, cfg, _ = models
    d = engine_test_config()
    d["text_config"]["cross_attention_layers"] = [1, 9]
    with pytest.raises(ValueError, match="cross_attention_layers"):
        MllamaConfig.from_dict(d)
    assert cfg.self_text.num_hidden_layers == 2 and cfg.cross_text.num_hidden_layers == 2
