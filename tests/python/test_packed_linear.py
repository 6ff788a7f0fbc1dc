"""oneDNN-prepacked linear layers against a float64 reference, and their contract."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm.model import packed_linear

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 70, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_reference(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 80, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 80, generator=g)
    y = packed_linear.linear(x, packed_linear.pack(w), b)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert y.shape == (rows, 96) and y.dtype == torch.float32 and y.is_contiguous()
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_bfloat16_matches_the_float_product():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 48, generator=g).bfloat16()
    x = torch.randn(5, 48, generator=g).bfloat16()
    y = packed_linear.linear(x, packed_linear.pack(w), None)
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)


def test_row_buckets_are_few_and_tight():
    buckets = {packed_linear.padded_rows(n) for n in range(1, 4097)}
    assert len(buckets) <= 16 + 8 * 8  # exact to 16, then 8 per octave
    for n in range(1, 4097):
        p = packed_linear.padded_rows(n)
        assert n <= p and (p == n if n <= 16 else p - n < n / 8)
        assert packed_linear.padded_rows(p) == p


def test_small_weights_stay_strided():
    assert not packed_linear.worth_packing(torch.empty(128, 256))
    assert packed_linear.worth_packing(torch.empty(256, 256))
    assert packed_linear.worth_packing(torch.empty(1024, 1024))


def test_no_rows():
    y = packed_linear.linear(torch.empty(0, 8), packed_linear.pack(torch.ones(4, 8)), None)
    assert y.shape == (0, 4)


@pytest.mark.parametrize("weight", [torch.ones(4), torch.ones(2, 3, dtype=torch.float64),
                                    torch.ones(2, 3, dtype=torch.float16)])
def test_rejects_what_it_cannot_pack(weight):
    with pytest.raises(ValueError, match="expected a 2-D float32 or bfloat16 CPU tensor"):
        packed_linear.pack(weight)


@pytest.mark.parametrize("tied", [False, True])
def test_prepack_releases_the_strided_weight(tmp_path, tied, monkeypatch):
    from pagedllm.model import load_model, write_random_checkpoint
    from pagedllm.model.checkpoint import PRESETS

    monkeypatch.setattr(packed_linear, "MIN_PACKED_ELEMENTS", 0)
    write_random_checkpoint(tmp_path, {**PRESETS["tiny"], "tie_word_embeddings": tied}, seed=3)
    plain, _ = load_model(tmp_path)
    packed, _ = load_model(tmp_path, prepack=True)
    names = {n for n, _ in packed.named_parameters()}
    assert not any(n.endswith("proj.weight") or n == "lm_head.weight" for n in names)
    assert "embed_tokens.weight" in names  # the embedding (and a tied head) stays strided
    if tied:
        assert packed.lm_head is None and packed.lm_head_weight is packed.embed_tokens.weight
    else:
        with pytest.raises(RuntimeError, match="prepacked"):
            packed.lm_head_weight
    h = torch.randn(3, plain.config.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(packed.compute_logits(h), plain.compute_logits(h), rtol=1e-5, atol=1e-5)
    packed_count = sum(1 for m in packed.modules() if getattr(m, "packed", None) is not None)
    assert packed.prepack_weights() == packed_count  # packing twice changes nothing


def test_prepack_leaves_small_weights(tmp_path):
    from pagedllm.model import load_model, write_random_checkpoint
    from pagedllm.model.checkpoint import PRESETS

    # hidden 64, vocab 512: every weight under MIN_PACKED_ELEMENTS
    small = {"hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512}
    write_random_checkpoint(tmp_path, {**PRESETS["tiny"], **small}, seed=3)
    model, _ = load_model(tmp_path, prepack=True)
    assert model.prepack_weights() == 0
    assert all(getattr(m, "packed", None) is None for m in model.modules())
    assert any(n.endswith("proj.weight") for n, _ in model.named_parameters())
