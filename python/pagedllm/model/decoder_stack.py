"""The CPU step's decoder layers in one kernel call (`_core.decoder_stack`).

A Llama step on the CPU calls about 25 small ops per layer from Python (norms, projections,
RoPE, the cache write, attention, SiLU-and-mul); at one or a few sequences on a small model
their Python dispatch costs as much as their arithmetic. `_core.decoder_stack` runs the same
kernels, in the same order on the same buffers, for every layer and the final norm in one call
with the GIL released, so its output is the Python path's bit for bit
(tests/python/test_decoder_stack.py checks that).

It serves a plain Llama model (LlamaForCausalLM.build_decoder_stack: its own layer classes,
every projection packed for pagedllm's GEMM, packed_linear backend "pagedllm": AVX-512 CPUs by
default), float32 or bfloat16, on a step without block-sparse decode, without a key-bounds pool
and without an observer; anything else takes the Python layers. PAGEDLLM_DECODER_STACK=0 turns it off
for the models made (or packed) while it is set.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from pagedllm.model.attention import AttentionMetadata
    from pagedllm.model.config import ModelConfig
    from pagedllm.model.kv_cache import PagedKVCache

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
        from pagedllm import _core

        self._core = _core
        self.weights = weights
        self.eps = eps
        self.scale = scale
        self._workspace: Optional[torch.Tensor] = None  # reused while large enough

    @classmethod
    def create(cls, layers: list, final_norm: torch.Tensor, config: "ModelConfig",
               eps: float) -> Optional["DecoderStack"]:
        """The stack of a model's layers, or None in a build without the CPU kernels.

        Args:
            layers: per layer (input_norm, post_norm, qkv, qkv_bias, o, o_bias, gate_up,
                gate_up_bias, down, down_bias): the norm weights, the projections' packed data
                (packed_linear backend "pagedllm") and their biases or None.
            final_norm: [hidden_size], the final norm's weight.
            config: the model's config (sizes).
            eps: the RMSNorm epsilon.
        Returns:
            The DecoderStack, or None.
        Raises:
            ValueError: a weight of the wrong shape or dtype (from `_core.DecoderWeights`).
        """
        from pagedllm import _core

        if not hasattr(_core, "decoder_stack") or not layers:
            return None
        weights = _core.DecoderWeights(layers, final_norm, config.hidden_size,
                                       config.num_attention_heads, config.num_key_value_heads,
                                       config.head_dim, config.intermediate_size)
        return cls(weights, eps, config.head_dim ** -0.5)

    @staticmethod
    def serves(x: torch.Tensor, meta: "AttentionMetadata", kv: "PagedKVCache") -> bool:
        """Whether this step can run here: CPU tensors, dense decode, no key-bounds pool."""
        return (meta.sparse is None and x.device.type == "cpu" and kv.device.type == "cpu"
                and not kv.has_key_bounds)

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
        out = torch.empty_like(x)
        self._core.decoder_stack(self.weights, out, x, cos, sin, meta.slot_mapping,
                                 meta.block_tables, meta.context_lens, meta.cu_seqlens_q,
                                 meta.num_decode_seqs, kv.key_caches, kv.value_caches,
                                 kv.kernel_kv_dtype, kv.k_scale, kv.v_scale, self.eps, self.scale,
                                 self._workspace_for(x.shape[0]))
        return out
