"""The Llama forward pass in torch, attention on the paged KV cache.

Per layer: RMSNorm -> fused qkv projection -> RoPE by per-token positions -> reshape_and_cache
of the new k/v -> paged attention (decode and prefill kernels from _core) -> o_proj -> residual
-> RMSNorm -> fused gate_up projection -> SiLU(gate) * up -> down_proj -> residual.

The numerics follow transformers' LlamaForCausalLM in float32 operation for operation (the
same RMSNorm, RoPE and SiLU arithmetic); only the fused matmuls and the attention kernels sum
in a different order. On the CPU the element-wise steps are fused C++ kernels (pagedllm.ops:
residual add + RMSNorm, RoPE in place, SiLU-and-mul), which round as the torch expressions do;
a layer's last residual add is deferred into the next layer's first norm (forward_deferred).
Parameters are created uninitialised: use `load_model` to fill them.
`forward` applies the final norm and returns hidden states; `compute_logits` applies lm_head.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm import ops
from pagedllm.model import packed_linear
from pagedllm.model.attention import AttentionMetadata, paged_attention
from pagedllm.model.config import ModelConfig
from pagedllm.model.decoder_stack import DecoderStack, enabled as decoder_stack_enabled
from pagedllm.model.inference import inference
from pagedllm.model.kv_cache import PagedKVCache
from pagedllm.model.rope import RotaryEmbedding


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """y = x @ weight.T + bias, weight [out_features, in_features] (uninitialised).

    After `prepack()` the weight lives only in its GEMM kernel's layout (`packed`, a
    packed_linear.PackedWeight; `weight` is then None): see pagedllm.model.packed_linear.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(out_features, in_features, dtype=dtype)
        self.bias = _param(out_features, dtype=dtype) if bias else None
        self.packed: Optional[packed_linear.PackedWeight] = None

    def prepack(self) -> bool:
        """Moves the weight into its GEMM kernel's layout once (the strided copy is released), if
        it is large enough to gain from it (packed_linear.worth_packing). Returns whether it is
        packed."""
        if self.packed is None and packed_linear.worth_packing(self.weight):
            self.packed = packed_linear.pack(self.weight.data)
            self.weight = None
        return self.packed is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [n, in_features] -> [n, out_features]
        if self.packed is not None:
            return packed_linear.linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)


def prepack_linears(root: nn.Module, dtype: torch.dtype) -> int:
    """Prepacks every Linear under root (Linear.prepack decides which weights gain).

    Args:
        root: the module whose Linear layers to pack (a whole model, or its decoder).
        dtype: the model's dtype, one of packed_linear.PACKABLE_DTYPES.

    Returns:
        How many linear layers are packed (0 when no packing backend runs here).
    Raises:
        ValueError: dtype cannot be packed.
    """
    if dtype not in packed_linear.PACKABLE_DTYPES:
        raise ValueError(f"model dtype {dtype}: prepacking expects one of "
                         f"{packed_linear.PACKABLE_DTYPES}")
    if not packed_linear.available(dtype):
        return 0
    return sum(m.prepack() for m in root.modules() if isinstance(m, Linear))


class Embedding(nn.Module):
    """Row lookup in weight [vocab_size, hidden_size] (uninitialised).

    A tied embedding doubles as the lm_head: `pack_tied()` moves the matrix into pagedllm's GEMM
    layout once (the strided copy is released, `weight` is then None); the lookup then gathers
    its rows from the panels and `logits` multiplies against them.
    """

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(vocab_size, hidden_size, dtype=dtype)
        self.packed: Optional[packed_linear.PackedWeight] = None

    def pack_tied(self) -> bool:
        """Packs the matrix for its use as a tied lm_head (packed_linear.tied_backend decides
        whether that runs here). Returns whether it is packed."""
        if (self.packed is None and packed_linear.worth_packing(self.weight)
                and packed_linear.tied_backend(self.weight.dtype) is not None):
            self.packed = packed_linear.pack(self.weight.data, "pagedllm")
            self.weight = None
        return self.packed is not None

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` ([n] int64) of the matrix: [n, hidden_size]."""
        if self.packed is not None:
            return packed_linear.gather_rows(self.packed, ids)
        return F.embedding(ids, self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [n] int64 -> [n, hidden_size]
        return self.lookup(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden_size] @ weight.T: [n, vocab_size] in the model dtype (the tied
        lm_head)."""
        if self.packed is not None:
            return packed_linear.linear(hidden, self.packed, None)
        return F.linear(hidden, self.weight)


class RMSNorm(nn.Module):
    """weight * x / sqrt(mean(x^2) + eps) over the last dim, statistics in float32.

    float32 / bfloat16 on the CPU: `_core.rms_norm` (transformers' LlamaRMSNorm arithmetic up to
    summation order; torch's own rms_norm is 5-10x slower on prefill-sized inputs here); bfloat16
    rounds as transformers does (normalise in fp32, round, then scale). Elsewhere the same in
    torch ops (pagedllm.ops.rms_norm).
    """

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(hidden_size, dtype=dtype)
        self.eps = eps
        self.shape = (hidden_size,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., hidden_size] -> [..., hidden_size]
        rows = x.reshape(-1, x.shape[-1])  # [n, hidden_size] (a view when contiguous)
        out = torch.empty_like(rows)
        ops.rms_norm(out, rows, self.weight, self.eps)
        return out.view(x.shape)

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """x += delta in place (the residual stream), then returns norm(x), in one pass.

        Args:
            x: [n, hidden_size], updated in place.
            delta: [n, hidden_size], what the previous block adds to the residual stream.
        Returns:
            [n, hidden_size], the norm of the updated x.
        """
        out = torch.empty_like(x)
        ops.fused_add_rms_norm(out, x, delta, self.weight, self.eps)
        return out


class LlamaAttention(nn.Module):
    """Self-attention with a fused qkv projection, reading and writing the paged cache."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scale = config.head_dim ** -0.5
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                               config.attention_bias, dtype)
        self.o_proj = Linear(self.q_size, config.hidden_size, config.attention_bias, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata, kv: PagedKVCache, layer: int) -> torch.Tensor:
        # x: [num_tokens, hidden_size]; cos/sin: [num_tokens, 1, head_dim]
        t = x.shape[0]
        qkv = self.qkv_proj(x)  # [num_tokens, q_size + 2 * kv_size]
        # q and k rotated together, in place in qkv:
        # qk: [num_tokens, num_heads + num_kv_heads, head_dim] (token stride of qkv)
        qk = qkv[:, :self.q_size + self.kv_size].view(
            t, self.num_heads + self.num_kv_heads, self.head_dim)
        ops.rotary_embedding(qk, cos, sin)
        q = qk[:, :self.num_heads]       # [num_tokens, num_heads, head_dim]
        k = qk[:, self.num_heads:]       # [num_tokens, num_kv_heads, head_dim]
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, kv.key_cache(layer), kv.value_cache(layer), meta,
                              self.scale, kv.kernel_kv_dtype, kv.k_scale, kv.v_scale,
                              key_bounds=kv.key_bounds(layer))
        # out: [num_tokens, num_heads, head_dim] -> [num_tokens, hidden_size]
        return self.o_proj(out.view(t, self.q_size))


class LlamaMLP(nn.Module):
    """down(SiLU(gate(x)) * up(x)) with gate and up fused into one projection."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size,
                                   config.mlp_bias, dtype)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, config.mlp_bias,
                                dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [n, hidden_size] -> gate_up: [n, 2 * intermediate_size]
        gate_up = self.gate_up_proj(x)
        # act: [n, intermediate_size] = silu(gate) * up
        act = gate_up.new_empty((gate_up.shape[0], self.intermediate_size))
        ops.silu_and_mul(act, gate_up)
        return self.down_proj(act)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm transformer block: x += attn(norm(x)); x += mlp(norm(x))."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(config, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = LlamaMLP(config, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata, kv: PagedKVCache, layer: int) -> torch.Tensor:
        # x: [num_tokens, hidden_size], updated in place and returned
        x += self.forward_deferred(x, None, cos, sin, meta, kv, layer)
        return x

    def forward_deferred(self, x: torch.Tensor, pending: Optional[torch.Tensor],
                         cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata,
                         kv: PagedKVCache, layer: int) -> torch.Tensor:
        """The layer with its residual adds fused into the norms that follow them.

        Args:
            x: [num_tokens, hidden_size], the residual stream, updated in place.
            pending: [num_tokens, hidden_size], the previous layer's MLP output not yet added
                to x (added here, fused into the input norm), or None.
            cos, sin, meta, kv, layer: as for forward.
        Returns:
            [num_tokens, hidden_size]: this layer's MLP output, not yet added to x (the caller
            adds it, or hands it to the next layer or the final norm).
        """
        h = self.input_layernorm(x) if pending is None else self.input_layernorm.add_norm(x, pending)
        h = self.post_attention_layernorm.add_norm(
            x, self.self_attn(h, cos, sin, meta, kv, layer))
        return self.mlp(h)


class LlamaForCausalLM(nn.Module):
    """Llama decoder over a paged KV cache.

    Parameter names are pagedllm's (qkv_proj, gate_up_proj fused); the loader maps the Hugging
    Face names onto them. With tied embeddings there is no lm_head parameter: compute_logits
    uses embed_tokens.weight.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, dtype)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, config.vocab_size, False, dtype)
        self.rotary = RotaryEmbedding(config)
        # The CPU step's layers in one kernel call (decoder_stack.py), built at the first step
        # after the weights are packed; False: not built yet, None: not used (it cannot serve
        # this model, or PAGEDLLM_DECODER_STACK=0 when the model was made or packed).
        self._stack: Optional[DecoderStack] | bool = False if decoder_stack_enabled() else None

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[vocab_size, hidden_size]: lm_head's weight, or the embedding when tied.

        Raises:
            RuntimeError: lm_head was prepacked (its weight exists only in the packed layout).
        """
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        if head.packed is not None:
            raise RuntimeError("lm_head is prepacked: its weight has no strided copy")
        return head.weight

    def build_decoder_stack(self) -> Optional[DecoderStack]:
        """The CPU step's layers as one `_core.decoder_stack` call (model/decoder_stack.py).

        Returns:
            The DecoderStack, or None when it cannot serve this model: a dtype other than
            float32 / bfloat16, a layer of another class (tensor-parallel, Mllama), or a
            projection not packed for pagedllm's GEMM (strided, oneDNN, on a GPU).
        """
        if self.dtype not in (torch.float32, torch.bfloat16) or type(self.norm) is not RMSNorm:
            return None

        def packed(lin) -> Optional[tuple]:
            if (type(lin) is not Linear or lin.packed is None or lin.packed.backend != "pagedllm"
                    or lin.packed.data.device.type != "cpu"):
                return None
            return lin.packed.data, lin.bias

        layers = []
        for layer in self.layers:
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
        return DecoderStack.create(layers, self.norm.weight, self.config, self.norm.eps)

    def prepack_weights(self) -> int:
        """Moves every projection weight into its GEMM kernel's layout (CPU fast path:
        packed_linear chooses pagedllm's kernels or oneDNN's).

        A tied embedding is packed once in pagedllm's layout and serves both the lookup and the
        lm_head (Embedding.pack_tied; packed_linear.tied_backend says where that runs). Weights
        too small to gain stay strided (packed_linear.MIN_PACKED_ELEMENTS).
        Returns:
            How many linear layers (a tied lm_head counted once) are packed (0 when no backend
            runs here).
        Raises:
            ValueError: the model's dtype cannot be packed.
        """
        packed = prepack_linears(self, self.dtype)
        if self.lm_head is None and self.embed_tokens.pack_tied():
            packed += 1
        # the weights moved: build the decoder stack again at the next step
        self._stack = False if decoder_stack_enabled() else None
        return packed

    @inference
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: PagedKVCache, inputs_embeds: Optional[torch.Tensor] = None,
                observer=None) -> torch.Tensor:
        """Runs one step: the new tokens of every scheduled sequence, packed.

        Args:
            input_ids: [num_tokens] int64, token ids in the packed order of `meta`.
            positions: [num_tokens] int64, each token's position in its sequence.
            meta: where the tokens' K/V go and what each sequence attends to.
            kv: the paged cache; the new tokens' K/V are written into it.
            inputs_embeds: [num_tokens, hidden_size], used instead of embedding input_ids
                (multimodal models put image embeddings at their placeholder rows).
            observer: None, or an object told `after_layer(-1, x)` after the embedding and
                `before_layer(i)` / `after_layer(i, x)` around layer i, x being the residual
                stream [num_tokens, hidden_size] (numeric checks, per-layer trace spans:
                engine/layer_probe.py).
        Returns:
            hidden: [num_tokens, hidden_size], final RMSNorm applied (feed rows to compute_logits).
        Raises:
            ValueError: mismatched token counts, or a cache made for another model.
        """
        n = input_ids.shape[0]
        if input_ids.dim() != 1 or positions.shape != input_ids.shape or meta.num_tokens != n:
            raise ValueError(f"input_ids {list(input_ids.shape)}, positions "
                             f"{list(positions.shape)}, slot_mapping [{meta.num_tokens}]: "
                             f"expected three [num_tokens] vectors")
        if kv.num_layers != len(self.layers):
            raise ValueError(f"the KV cache has {kv.num_layers} layers, the model "
                             f"{len(self.layers)}")
        if observer is None and self._stack is False:
            self._stack = self.build_decoder_stack()
        if (inputs_embeds is None and observer is None and self._stack is not None
                and input_ids.device.type == "cpu" and DecoderStack.serves(input_ids, meta, kv)):
            x, cos, sin = self._token_rows(input_ids, positions)
            return self._stack.run(x, cos, sin, meta, kv)
        # x: [num_tokens, hidden_size]
        if inputs_embeds is None:
            x = self.embed_tokens(input_ids)
        elif inputs_embeds.shape != (n, self.config.hidden_size):
            raise ValueError(f"inputs_embeds {list(inputs_embeds.shape)}: expected "
                             f"[{n}, {self.config.hidden_size}]")
        else:
            x = inputs_embeds
        # cos, sin: [num_tokens, 1, head_dim], shared by every layer
        cos, sin = self.rotary.tables(positions, self.dtype)
        if observer is None and self._stack is not None and DecoderStack.serves(x, meta, kv):
            return self._stack.run(x.contiguous(), cos, sin, meta, kv)
        if observer is None and all(type(m) is LlamaDecoderLayer for m in self.layers):
            pending = None  # each layer's MLP output, added in the next norm
            for i, layer in enumerate(self.layers):
                pending = layer.forward_deferred(x, pending, cos, sin, meta, kv, i)
            return self.norm(x) if pending is None else self.norm.add_norm(x, pending)
        if observer is None:
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, meta, kv, i)
            return self.norm(x)
        observer.after_layer(-1, x)
        for i, layer in enumerate(self.layers):
            observer.before_layer(i)
            x = layer(x, cos, sin, meta, kv, i)
            observer.after_layer(i, x)
        return self.norm(x)

    def _token_rows(self, input_ids: torch.Tensor, positions: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder stack's inputs in one kernel call (`_core.token_rows`): the tokens'
        embeddings and RoPE rows, the same rows embed_tokens and rotary.tables give.

        Args:
            input_ids, positions: [num_tokens] int64 on the CPU.
        Returns:
            x [num_tokens, hidden_size], cos and sin [num_tokens, 1, head_dim].
        """
        emb, n = self.embed_tokens, input_ids.shape[0]
        table = emb.packed.data if emb.packed is not None else emb.weight
        ids = input_ids if input_ids.dtype == torch.int64 else input_ids.long()
        pos = positions if positions.dtype == torch.int64 else positions.long()
        x = table.new_empty((n, self.config.hidden_size))
        cos = table.new_empty((n, 1, self.config.head_dim))
        sin = table.new_empty((n, 1, self.config.head_dim))
        rows = 1  # the tables as they are (they keep the rows they grew to)
        while True:
            cos_t, sin_t = self.rotary.table_rows(rows, self.dtype)
            need = ops._core.token_rows(x, cos, sin, ids, pos, table, self.config.vocab_size,
                                        emb.packed is not None, cos_t, sin_t)
            if not need:
                return x, cos, sin
            rows = need  # a position past the tables: grow them, gather again

    @inference
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of the given rows of forward's output.

        Args:
            hidden: [n, hidden_size], rows of forward's (already normalised) output.
        Returns:
            logits: [n, vocab_size] float32.
        """
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        return self.embed_tokens.logits(hidden).float()
