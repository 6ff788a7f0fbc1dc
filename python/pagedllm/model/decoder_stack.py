"""The CPU step's decoder layers in one kernel call (`_core.decoder_stack`).

A Llama step on the CPU calls about 25 small ops per layer from Python (norms, projections,
RoPE, the cache write, attention, SiLU-and-mul); at one or a few sequences on a small model
their Python dispatch costs as much as their arithmetic. `_core.decoder_stack` runs the same
kernels, in the same order on the same buffers, for every layer and the final norm in one call
with the GIL released, so its output is the Python path's bit for bit
(tests/python/test_decoder_stack.py checks that).

It serves a plain Llama model (LlamaForCausalLM with its own layer classes) whose projections
are all packed for pagedllm's GEMM (packed_linear backend "pagedllm": AVX-512 CPUs by default),
float32 or bfloat16, on a step without block-sparse decode, without a key-bounds pool and
without an observer; anything else takes the Python layers. PAGEDLLM_DECODER_STACK=0 turns it off
for the models made (or packed) while it is set.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:  # imported lazily: llama.py imports this module
    from pagedllm.model.attention import AttentionMetadata
    from pagedllm.model.kv_cache import PagedKVCache
    from pagedllm.model.llama import LlamaForCausalLM

ENV = "PAGEDLLM_DECODER_STACK"


def enabled() -> bool:
    """False when PAGEDLLM_DECODER_STACK is 0 / false / off (LlamaForCausalLM reads it when it
    is made and when its weights are packed)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


class DecoderStack:
    """A model's decoder weights handed to `_core.decoder_stack` once, and the step call.

    Args:
        weights: the `_core.DecoderWeights` of the model.
        eps: the RMSNorm epsilon.
        scale: the softmax scale.
    """

    def __init__(self, weights, eps: float, scale: float) -> None:
        self.weights = weights
        self.eps = eps
        self.scale = scale
        self._workspace: Optional[torch.Tensor] = None  # reused while large enough

    @classmethod
    def build(cls, model: "LlamaForCausalLM") -> Optional["DecoderStack"]:
        """The stack of `model`, or None when it cannot serve it (see the module docstring).

        Args:
            model: a LlamaForCausalLM, weights loaded and packed.
        Returns:
            The DecoderStack, or None.
        """
        from pagedllm import _core
        from pagedllm.model.llama import (Linear, LlamaAttention, LlamaDecoderLayer, LlamaMLP,
                                          RMSNorm)

        if not hasattr(_core, "decoder_stack"):  # a build without the CPU kernels
            return None
        if model.dtype not in (torch.float32, torch.bfloat16) or type(model.norm) is not RMSNorm:
            return None

        def packed(lin) -> Optional[tuple]:
            if (type(lin) is not Linear or lin.packed is None or lin.packed.backend != "pagedllm"
                    or lin.packed.data.device.type != "cpu"):
                return None
            return lin.packed.data, lin.bias

        layers = []
        for layer in model.layers:
            if (type(layer) is not LlamaDecoderLayer or type(layer.self_attn) is not LlamaAttention
                    or type(layer.mlp) is not LlamaMLP
                    or type(layer.input_layernorm) is not RMSNorm
                    or type(layer.post_attention_layernorm) is not RMSNorm):
                return None
            attn, mlp = layer.self_attn, layer.mlp
            projections = [packed(attn.qkv_proj), packed(attn.o_proj), packed(mlp.gate_up_proj),
                           packed(mlp.down_proj)]
            if any(p is None for p in projections):
                return None
            flat = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            for weight, bias in projections:
                flat += [weight, bias]
            layers.append(tuple(flat))
        if not layers:
            return None
        cfg = model.config
        weights = _core.DecoderWeights(layers, model.norm.weight, cfg.hidden_size,
                                       cfg.num_attention_heads, cfg.num_key_value_heads,
                                       cfg.head_dim, cfg.intermediate_size)
        return cls(weights, model.norm.eps, cfg.head_dim ** -0.5)

    @staticmethod
    def serves(x: torch.Tensor, meta: "AttentionMetadata", kv: "PagedKVCache") -> bool:
        """Whether this step can run here: CPU tensors, dense decode, no key-bounds pool."""
        return (meta.sparse is None and x.device.type == "cpu"
                and kv.key_cache(0).device.type == "cpu" and kv.key_bounds(0) is None)

    def _workspace_for(self, num_tokens: int) -> torch.Tensor:
        need = self.weights.workspace_bytes(num_tokens)
        if self._workspace is None or self._workspace.numel() < need:
            self._workspace = torch.empty(need, dtype=torch.uint8)
        return self._workspace

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            meta: "AttentionMetadata", kv: "PagedKVCache") -> torch.Tensor:
        """Every layer and the final norm for one step.

        Args:
            x: [num_tokens, hidden_size] contiguous, the residual stream (updated in place).
            cos, sin: [num_tokens, 1, head_dim] RoPE tables of x's dtype.
            meta: the step's AttentionMetadata (dense).
            kv: the paged cache.
        Returns:
            [num_tokens, hidden_size]: the final RMSNorm of the residual stream.
        """
        from pagedllm import _core

        n = x.shape[0]
        out = torch.empty_like(x)
        layers = range(self.weights.num_layers)
        _core.decoder_stack(self.weights, out, x, cos, sin, meta.slot_mapping, meta.block_tables,
                            meta.context_lens, meta.cu_seqlens_q, meta.num_decode_seqs,
                            [kv.key_cache(i) for i in layers], [kv.value_cache(i) for i in layers],
                            kv.kernel_kv_dtype, kv.k_scale, kv.v_scale, self.eps, self.scale,
                            self._workspace_for(n))
        return out
