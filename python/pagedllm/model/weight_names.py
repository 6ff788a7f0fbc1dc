"""The Hugging Face Llama tensor names and where each one goes in pagedllm's model.

This is the one place that knows the checkpoint layout. pagedllm fuses q/k/v into one
`qkv_proj` and gate/up into one `gate_up_proj`; a checkpoint tensor therefore maps to a block of
rows of a model parameter. The loader and the random-checkpoint writer both use this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedllm.model.config import ModelConfig


@dataclass(frozen=True)
class TensorSlot:
    """Where one checkpoint tensor goes: rows [row_offset, row_offset + shape[0]) of `param`."""

    shape: tuple[int, ...]
    param: str        # name in LlamaForCausalLM.named_parameters()
    row_offset: int = 0


# Checkpoint tensors that carry no weights and are skipped when present (older exports kept
# the RoPE buffer).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def expected_tensor_count(config: ModelConfig) -> int:
    """len(expected_tensors(config)), computed without building the table."""
    per_layer = 2 + 4 * (1 + config.attention_bias) + 3 * (1 + config.mlp_bias)
    return 2 + config.num_hidden_layers * per_layer + (0 if config.tie_word_embeddings else 1)


def expected_tensors(config: ModelConfig) -> dict[str, TensorSlot]:
    """Every tensor a checkpoint of `config` must contain, in a stable order (embeddings, layers,
    final norm, lm_head), mapped to its slot. A tied lm_head is not listed."""
    h, f = config.hidden_size, config.intermediate_size
    q, kv = config.q_size, config.kv_size
    out: dict[str, TensorSlot] = {"model.embed_tokens.weight":
                                  TensorSlot((config.vocab_size, h), "embed_tokens.weight")}
    for i in range(config.num_hidden_layers):
        src, dst = f"model.layers.{i}", f"layers.{i}"
        out[f"{src}.input_layernorm.weight"] = TensorSlot((h,), f"{dst}.input_layernorm.weight")
        kinds = ["weight"] + (["bias"] if config.attention_bias else [])
        for kind in kinds:
            tail = (h,) if kind == "weight" else ()
            qkv = f"{dst}.self_attn.qkv_proj.{kind}"
            out[f"{src}.self_attn.q_proj.{kind}"] = TensorSlot((q,) + tail, qkv, 0)
            out[f"{src}.self_attn.k_proj.{kind}"] = TensorSlot((kv,) + tail, qkv, q)
            out[f"{src}.self_attn.v_proj.{kind}"] = TensorSlot((kv,) + tail, qkv, q + kv)
            out[f"{src}.self_attn.o_proj.{kind}"] = TensorSlot(
                (h, q) if kind == "weight" else (h,), f"{dst}.self_attn.o_proj.{kind}")
        out[f"{src}.post_attention_layernorm.weight"] = TensorSlot(
            (h,), f"{dst}.post_attention_layernorm.weight")
        kinds = ["weight"] + (["bias"] if config.mlp_bias else [])
        for kind in kinds:
            tail = (h,) if kind == "weight" else ()
            gate_up = f"{dst}.mlp.gate_up_proj.{kind}"
            out[f"{src}.mlp.gate_proj.{kind}"] = TensorSlot((f,) + tail, gate_up, 0)
            out[f"{src}.mlp.up_proj.{kind}"] = TensorSlot((f,) + tail, gate_up, f)
            out[f"{src}.mlp.down_proj.{kind}"] = TensorSlot(
                (h, f) if kind == "weight" else (h,), f"{dst}.mlp.down_proj.{kind}")
    out["model.norm.weight"] = TensorSlot((h,), "norm.weight")
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = TensorSlot((config.vocab_size, h), "lm_head.weight")
    return out
