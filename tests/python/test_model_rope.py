"""RoPE against transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb: bit for bit."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pagedllm.model import ModelConfig
from pagedllm.model.rope import RotaryEmbedding

ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    # original_max_position_embeddings small enough that all three frequency bands occur
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
}


@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("head_dim, theta", [(64, 10000.0), (128, 500000.0), (32, 10000.0)])
def test_rope_matches_transformers_exactly(rope, head_dim, theta):
    d = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 2 * head_dim,
         "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "rope_theta": theta, "rope_scaling": ROPES[rope],
         "max_position_embeddings": 8192}
    hf_rope = LlamaRotaryEmbedding(LlamaConfig(**d))
    ours = RotaryEmbedding(ModelConfig.from_dict(d))
    assert torch.equal(ours.inv_freq, hf_rope.inv_freq)

    g = torch.Generator().manual_seed(head_dim)
    positions = torch.randint(0, 8192, (53,), generator=g)
    q = torch.randn(1, 2, 53, head_dim, generator=g)   # transformers: [batch, heads, seq, dim]
    k = torch.randn(1, 1, 53, head_dim, generator=g)
    cos, sin = hf_rope(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)

    c, s = ours.tables(positions)
    # ours takes [tokens, heads, dim]; feed q and k as one strided view, as the model does
    qk = torch.cat([q[0], k[0]], dim=0).transpose(0, 1)  # [53, 3, head_dim]
    qk_strided = torch.cat([qk, torch.zeros_like(qk)], dim=1)[:, :3]
    out = RotaryEmbedding.apply(qk_strided, c, s)
    assert out.is_contiguous()
    assert torch.equal(out[:, :2], q_ref[0].transpose(0, 1))
    assert torch.equal(out[:, 2:], k_ref[0].transpose(0, 1))


def test_llama3_scaling_changes_only_low_frequencies():
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 128,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1}
    plain = RotaryEmbedding(ModelConfig.from_dict(base)).inv_freq
    scaled = RotaryEmbedding(ModelConfig.from_dict({**base, "rope_scaling": ROPES["llama3"]})).inv_freq
    assert torch.equal(scaled[:4], plain[:4])                      # high frequencies kept
    assert torch.allclose(scaled[-4:], plain[-4:] / 8.0)           # low frequencies / factor


def test_cached_tables_equal_the_direct_computation_and_follow_inv_freq():
    d = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "max_position_embeddings": 8192}
    rope = RotaryEmbedding(ModelConfig.from_dict(d))
    for positions in (torch.tensor([5]), torch.tensor([0, 1023, 1024, 3000]),
                      torch.randint(0, 4096, (40,))):  # the table grows past 1024 rows
        for dtype in (torch.float32, torch.bfloat16):
            cos, sin = rope.tables(positions, dtype)
            assert cos.shape == (len(positions), 1, 32) and cos.dtype == dtype
            # the rows of the whole range's tables (torch's vectorised cos / sin), bit for bit
            all_cos, all_sin = rope._compute(torch.arange(4096), dtype)
            assert torch.equal(cos[:, 0], all_cos[positions])
            assert torch.equal(sin[:, 0], all_sin[positions])
            # and within an ulp of the same ops on these positions alone
            want_cos, want_sin = rope._compute(positions, dtype)
            tol = dict(rtol=0, atol=2 * torch.finfo(dtype).eps)
            assert torch.allclose(cos[:, 0].float(), want_cos.float(), **tol)
            assert torch.allclose(sin[:, 0].float(), want_sin.float(), **tol)
    rope.inv_freq.mul_(2.0)  # changed in place: the tables are made again
    cos, _ = rope.tables(torch.tensor([7]))
    assert torch.allclose(cos[:, 0], rope._compute(torch.tensor([7]), torch.float32)[0],
                          rtol=0, atol=1e-6)
