"""Mllama (Llama 3.2 Vision): vision model -> projector -> cross-attention K/V in paged blocks,
and the Llama decoder whose cross-attention layers read them.

The decoder is transformers' MllamaTextModel: self-attention layers are pagedllm's Llama layers
on the ordinary paged pool (self-attention layer s uses pool layer s, counting self layers
only); each cross-attention layer is RMSNorm -> q_proj -> q_norm -> paged cross-attention over
the sequence's vision tokens -> o_proj, added through tanh(attn_gate), then RMSNorm -> MLP,
masked to the rows that see an image, added through tanh(mlp_gate). The vision tokens' K/V
(K = k_norm(k_proj(states)), V = v_proj(states), no RoPE) are written once per request by
`write_cross_kv` into the cross pool (cross layer c uses its layer c). A step where no sequence
has images skips the cross-attention layers, exactly as transformers does for text-only input;
rows that see no image get a zero contribution from them (vLLM's behaviour; transformers
instead averages over every vision token there: a documented deviation).
The embedding has vocab_size + 8 rows (the `<|image|>` id lies past the vocabulary).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from pagedllm import ops
from pagedllm.model.attention import AttentionMetadata
from pagedllm.model.cross_attention import CrossAttentionMetadata, paged_cross_attention
from pagedllm.model.kv_cache import PagedKVCache
from pagedllm.model.llama import (Embedding, Linear, LlamaDecoderLayer, LlamaMLP, RMSNorm,
                                  _param, prepack_linears)
from pagedllm.model.mllama_config import EMBED_EXTRA_ROWS, MllamaConfig
from pagedllm.model.rope import RotaryEmbedding


class MllamaCrossAttention(nn.Module):
    """Attention from the text rows to the vision tokens' paged K/V (q_norm / k_norm, no RoPE)."""

    def __init__(self, cfg: MllamaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        c = cfg.text
        self.num_heads, self.num_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.q_proj = Linear(c.hidden_size, self.num_heads * self.head_dim, False, dtype)
        self.k_proj = Linear(c.hidden_size, self.num_kv_heads * self.head_dim, False, dtype)
        self.v_proj = Linear(c.hidden_size, self.num_kv_heads * self.head_dim, False, dtype)
        self.o_proj = Linear(self.num_heads * self.head_dim, c.hidden_size, False, dtype)
        self.q_norm = RMSNorm(self.head_dim, c.rms_norm_eps, dtype)
        self.k_norm = RMSNorm(self.head_dim, c.rms_norm_eps, dtype)

    def project_kv(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cross K/V of vision states: [n, hidden] -> k, v [n, num_kv_heads, head_dim]."""
        n = states.shape[0]
        k = self.k_norm(self.k_proj(states).view(n, self.num_kv_heads, self.head_dim))
        v = self.v_proj(states).view(n, self.num_kv_heads, self.head_dim)
        return k, v

    def forward(self, x: torch.Tensor, cross: CrossAttentionMetadata, layer: int) -> torch.Tensor:
        # x: [num_tokens, hidden] -> q: [num_tokens, num_heads, head_dim]
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.num_heads, self.head_dim))
        out = paged_cross_attention(q, cross, layer, self.scale)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MllamaCrossDecoderLayer(nn.Module):
    """x += tanh(attn_gate) * xattn(norm(x)); x += tanh(mlp_gate) * row_mask * mlp(norm(x))."""

    def __init__(self, cfg: MllamaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        c = cfg.text
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.cross_attn = MllamaCrossAttention(cfg, dtype)
        self.cross_attn_attn_gate = _param(1, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.mlp = LlamaMLP(c, dtype)
        self.cross_attn_mlp_gate = _param(1, dtype=dtype)

    def forward(self, x: torch.Tensor, cross: CrossAttentionMetadata, layer: int) -> torch.Tensor:
        # x: [num_tokens, hidden_size], updated in place and returned
        x += self.cross_attn_attn_gate.tanh() * self.cross_attn(self.input_layernorm(x), cross,
                                                                layer)
        m = self.mlp(self.post_attention_layernorm(x)) * cross.row_mask.to(x.dtype)
        x += self.cross_attn_mlp_gate.tanh() * m
        return x


class MllamaTextDecoder(nn.Module):
    """The decoder: Llama self-attention layers and cross-attention layers, in config order.

    Args:
        cfg: the Mllama config.
        dtype: parameter dtype (uninitialised: the loader fills them).
    """

    def __init__(self, cfg: MllamaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        c = cfg.text
        self.config = c
        self.dtype = dtype
        self.cross_layers = cfg.cross_attention_layers
        self.embed_tokens = Embedding(c.vocab_size + EMBED_EXTRA_ROWS, c.hidden_size, dtype)
        cross = set(self.cross_layers)
        self.layers = nn.ModuleList(
            MllamaCrossDecoderLayer(cfg, dtype) if i in cross else LlamaDecoderLayer(c, dtype)
            for i in range(c.num_hidden_layers))
        # decoder layer -> its layer in the self pool or in the cross pool
        self.pool_layer = []
        counts = [0, 0]
        for i in range(c.num_hidden_layers):
            kind = int(i in cross)
            self.pool_layer.append(counts[kind])
            counts[kind] += 1
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, False, dtype)
        self.rotary = RotaryEmbedding(c)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: PagedKVCache, cross: Optional[CrossAttentionMetadata] = None,
                observer=None) -> torch.Tensor:
        """One step over the packed new tokens (see LlamaForCausalLM.forward).

        Args:
            input_ids, positions: [num_tokens] int64.
            meta, kv: the self-attention layers' metadata and pool (self layers only).
            cross: the cross-attention layers' metadata and pool; None: no sequence of the
                step has images, the cross-attention layers are skipped.
            observer: the layer observer (LlamaForCausalLM.forward).
        Returns:
            hidden: [num_tokens, hidden_size], final norm applied.
        """
        n = input_ids.shape[0]
        if positions.shape != input_ids.shape or meta.num_tokens != n:
            raise ValueError(f"input_ids {list(input_ids.shape)}, positions "
                             f"{list(positions.shape)}, slot_mapping [{meta.num_tokens}]: "
                             f"expected three [num_tokens] vectors")
        num_self = len(self.layers) - len(self.cross_layers)
        if kv.num_layers != num_self:
            raise ValueError(f"the KV cache has {kv.num_layers} layers, the model {num_self} "
                             f"self-attention layers")
        if cross is not None and cross.kv_ranges.shape != (n, 2):
            raise ValueError(f"kv_ranges {list(cross.kv_ranges.shape)}: expected [{n}, 2]")
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        cos, sin = self.rotary.tables(positions, self.dtype)  # [num_tokens, 1, head_dim]
        if observer is not None:
            observer.after_layer(-1, x)
        for i, layer in enumerate(self.layers):
            if isinstance(layer, MllamaCrossDecoderLayer):
                if cross is None:
                    continue
                if observer is not None:
                    observer.before_layer(i)
                x = layer(x, cross, self.pool_layer[i])
            else:
                if observer is not None:
                    observer.before_layer(i)
                x = layer(x, cos, sin, meta, kv, self.pool_layer[i])
            if observer is not None:
                observer.after_layer(i, x)
        return self.norm(x)


class MllamaForConditionalGeneration(nn.Module):
    """The Mllama model: `encode_images`, `write_cross_kv` and one decoder step (`forward`).

    Args:
        cfg: the Mllama config.
        dtype: parameter dtype (uninitialised: load_mllama fills them).
        vision_model: the vision encoder (None: a decoder-only instance, for tests that give
            vision states directly).
    """

    def __init__(self, cfg: MllamaConfig, dtype: torch.dtype = torch.float32,
                 vision_model: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.mllama_config = cfg
        self.config = cfg.self_text
        self.dtype = dtype
        self.vision_model = vision_model
        self.multi_modal_projector = nn.Linear(cfg.vision_output_dim, cfg.text.hidden_size,
                                               bias=True, dtype=dtype)
        self.multi_modal_projector.requires_grad_(False)
        self.language_model = MllamaTextDecoder(cfg, dtype)

    def prepack_weights(self) -> int:
        """Moves the decoder's projection weights into their GEMM kernel's layout (as
        LlamaForCausalLM.prepack_weights; the vision model and projector stay strided).

        Returns:
            How many linear layers are packed (0 when no packing backend runs here).
        Raises:
            ValueError: the model's dtype cannot be packed.
        """
        return prepack_linears(self.language_model, self.dtype)

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor, aspect_ratio_ids: torch.Tensor,
                      aspect_ratio_mask: torch.Tensor,
                      num_tiles: Sequence[int]) -> list[torch.Tensor]:
        """The projected vision states of the valid tiles of a batch of images.

        Args:
            pixel_values: [num_images, max_tiles, 3, H, W] float.
            aspect_ratio_ids: [num_images] int64.
            aspect_ratio_mask: [num_images, max_tiles] int64.
            num_tiles: the valid tiles of each image.
        Returns:
            One [num_tiles_i * num_patches, text hidden_size] tensor per image.
        """
        if self.vision_model is None:
            raise ValueError("this Mllama instance has no vision model")
        feats = self.vision_model(pixel_values.to(self.dtype), aspect_ratio_ids,
                                  aspect_ratio_mask)  # [k, max_tiles, num_patches, out_dim]
        states = self.multi_modal_projector(feats)   # [k, max_tiles, num_patches, hidden]
        return [s[:t].reshape(-1, s.shape[-1]) for s, t in zip(states, num_tiles)]

    @torch.inference_mode()
    def write_cross_kv(self, states: torch.Tensor, slots: torch.Tensor,
                       cross_kv: PagedKVCache) -> None:
        """Writes the K/V of vision states into the cross pool, every cross-attention layer.

        Args:
            states: [n, hidden_size] projected vision states (one sequence's, in order).
            slots: [n] int64 cross-pool slots.
            cross_kv: the cross pool.
        """
        lm = self.language_model
        for i in lm.cross_layers:
            layer = lm.pool_layer[i]
            k, v = lm.layers[i].cross_attn.project_kv(states.to(self.dtype))
            ops.reshape_and_cache(k, v, cross_kv.key_cache(layer), cross_kv.value_cache(layer),
                                  slots, cross_kv.kernel_kv_dtype, cross_kv.k_scale,
                                  cross_kv.v_scale)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: PagedKVCache, cross: Optional[CrossAttentionMetadata] = None,
                observer=None) -> torch.Tensor:
        """One decoder step (MllamaTextDecoder.forward)."""
        return self.language_model(input_ids, positions, meta, kv, cross, observer)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of rows of forward's output: [n, hidden_size] -> [n, vocab_size] float32."""
        return self.language_model.lm_head(hidden).float()
