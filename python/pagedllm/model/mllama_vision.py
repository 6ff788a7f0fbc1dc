"""The Mllama (Llama 3.2 Vision) vision encoder in torch, transformers' MllamaVisionModel numerics.

Per image of `max_num_tiles` square tiles (padded tiles included):
patch conv (no bias) -> + pre-tile embedding (aspect-ratio id, tanh-gated) -> class token
prepended per tile -> + gated position embedding ((1 - tanh g) x per-patch table + tanh g x
per-aspect-ratio tile table) -> layernorm_pre -> each tile padded with zero rows to a multiple
of 8 positions -> the "local" transformer (bidirectional, over all tiles of the image at once;
its outputs after `intermediate_layers_indices` are kept) -> layernorm_post -> + post-tile
embedding -> the global transformer (the same layers with tanh gates on the attention and MLP
branches) -> padding rows dropped, the final state concatenated with the kept intermediate ones.

The attention bias is transformers' exactly: a position that is padding (a padded tile, or a
padding row of any tile) may not attend to another padding position; real positions attend to
everything (padded tiles included), so outputs equal transformers' to float32 rounding for any
tile count. The two LayerNorms around the local transformer use eps 1e-5 whatever `norm_eps`
says (transformers builds them with the default); the encoder layers use `norm_eps`.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.model.clip_vision import VisionMlp
from pagedllm.model.mllama_vision_config import MllamaVisionConfig
from pagedllm.model.mllama_vision_weights import load_vision_state

_ROW_MULTIPLE = 8  # each tile's positions are padded to a multiple of this


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class _TileEmbedding(nn.Module):
    """transformers' MllamaPrecomputedAspectRatioEmbedding (gated): one vector per tile slot."""

    def __init__(self, cfg: MllamaVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.tiles, self.hidden = cfg.max_num_tiles, cfg.hidden_size
        self.embedding = nn.Embedding(cfg.max_aspect_ratio_id + 1, self.tiles * self.hidden,
                                      dtype=dtype)
        self.gate = _param(1, dtype=dtype)

    def forward(self, x: torch.Tensor, aspect_ratio_ids: torch.Tensor) -> torch.Tensor:
        # x: [B, tiles, positions, hidden]; aspect_ratio_ids: [B]
        emb = self.embedding(aspect_ratio_ids).reshape(-1, self.tiles, 1, self.hidden)
        return x + emb * self.gate.tanh()


class _GatedPositionEmbedding(nn.Module):
    """transformers' MllamaPrecomputedPositionEmbedding: per-patch and per-aspect-ratio tables."""

    def __init__(self, cfg: MllamaVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.tiles, self.positions, self.hidden = (cfg.max_num_tiles, cfg.num_patches,
                                                   cfg.hidden_size)
        self.gate = _param(1, dtype=dtype)
        self.embedding = _param(self.positions, self.hidden, dtype=dtype)
        self.tile_embedding = nn.Embedding(cfg.max_aspect_ratio_id + 1,
                                           self.tiles * self.positions * self.hidden, dtype=dtype)

    def forward(self, x: torch.Tensor, aspect_ratio_ids: torch.Tensor) -> torch.Tensor:
        # x: [B, tiles, num_patches, hidden]
        g = self.gate.tanh()
        x = x + ((1 - g) * self.embedding).view(1, 1, self.positions, self.hidden)
        tile = self.tile_embedding(aspect_ratio_ids)
        return x + g * tile.reshape(-1, self.tiles, self.positions, self.hidden)


class _Attention(nn.Module):
    def __init__(self, cfg: MllamaVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(h, h, bias=False, dtype=dtype) for _ in range(4))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # x: [B, T, hidden] -> q, k, v: [B, heads, T, head_dim]; bias: [B, 1, T, T]
        b, t, h = x.shape
        q, k, v = (p(x).view(b, t, self.num_heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # scale head_dim^-0.5
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h))


class _EncoderLayer(nn.Module):
    """Pre-norm layer; `gated` (global transformer) scales both branches by tanh(gate)."""

    def __init__(self, cfg: MllamaVisionConfig, gated: bool, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.norm_eps
        self.gated = gated
        self.self_attn = _Attention(cfg, dtype)
        self.mlp = VisionMlp(cfg, dtype)
        self.input_layernorm = nn.LayerNorm(h, eps=eps, dtype=dtype)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=eps, dtype=dtype)
        if gated:
            self.gate_attn = _param(1, dtype=dtype)
            self.gate_ffn = _param(1, dtype=dtype)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.self_attn(self.input_layernorm(x), bias)
        x = x + (self.gate_attn.tanh() * a if self.gated else a)
        m = self.mlp(self.post_attention_layernorm(x))
        return x + (self.gate_ffn.tanh() * m if self.gated else m)


class _Encoder(nn.Module):
    def __init__(self, cfg: MllamaVisionConfig, num_layers: int, gated: bool,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_EncoderLayer(cfg, gated, dtype) for _ in range(num_layers))


def attention_bias(aspect_ratio_mask: torch.Tensor, num_patches: int, padded_len: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """transformers' _prepare_aspect_ratio_attention_mask: finfo.min where both the query and
    the key are padding (a masked tile, or a row >= num_patches of any tile), else 0.

    Args:
        aspect_ratio_mask: [B, tiles], 1 for real tiles.
        num_patches: real positions per tile.
        padded_len: positions per tile after padding.
    Returns:
        [B, 1, tiles * padded_len, tiles * padded_len] of `dtype`.
    """
    b = aspect_ratio_mask.shape[0]
    pad_row = torch.arange(padded_len, device=aspect_ratio_mask.device) >= num_patches
    # padding: [B, tiles * padded_len], True at padding positions
    padding = ((aspect_ratio_mask == 0)[:, :, None] | pad_row[None, None, :]).reshape(b, -1)
    both = padding[:, :, None] & padding[:, None, :]
    bias = torch.zeros(both.shape, dtype=dtype, device=both.device)
    return bias.masked_fill_(both, torch.finfo(dtype).min).unsqueeze(1)


class MllamaVisionModel(nn.Module):
    """transformers' MllamaVisionModel (parameter names identical to its state_dict).

    Args:
        cfg: the validated vision config.
        dtype: parameter dtype (parameters are uninitialised: `load_state` or a loader fills
            them).
    """

    def __init__(self, cfg: MllamaVisionConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        h = cfg.hidden_size
        self.patch_embedding = nn.Conv2d(cfg.num_channels, h, cfg.patch_size, cfg.patch_size,
                                         bias=False, dtype=dtype)
        self.class_embedding = _param(h, dtype=dtype)
        self.gated_positional_embedding = _GatedPositionEmbedding(cfg, dtype)
        self.pre_tile_positional_embedding = _TileEmbedding(cfg, dtype)
        self.post_tile_positional_embedding = _TileEmbedding(cfg, dtype)
        self.layernorm_pre = nn.LayerNorm(h, eps=1e-5, dtype=dtype)
        self.layernorm_post = nn.LayerNorm(h, eps=1e-5, dtype=dtype)
        self.transformer = _Encoder(cfg, cfg.num_hidden_layers, False, dtype)
        self.global_transformer = _Encoder(cfg, cfg.num_global_layers, True, dtype)
        self.requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copies the vision weights of a checkpoint or state_dict into this model.

        Args:
            tensors: name -> tensor, names either bare (a transformers MllamaVisionModel's
                state_dict) or under `model.vision_model.` / `vision_model.` (other names, e.g.
                the language model's, are ignored then).
        Raises:
            ValueError: listing every missing, duplicated, unexpected, misshapen, non-float or
                non-finite tensor; nothing is copied then.
        """
        load_vision_state(self, tensors)

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor, aspect_ratio_ids: torch.Tensor,
                aspect_ratio_mask: torch.Tensor) -> torch.Tensor:
        """Encodes images (transformers' vision_model(...).last_hidden_state, one batch row).

        Args:
            pixel_values: [num_images, max_num_tiles, num_channels, image_size, image_size],
                preprocessed (multimodal/mllama_processor.py), padded tiles zero.
            aspect_ratio_ids: [num_images] integer, 1..max_aspect_ratio_id (0: padding).
            aspect_ratio_mask: [num_images, max_num_tiles], 1 for the image's real tiles.
        Returns:
            [num_images, max_num_tiles, num_patches, vision_output_dim] in the model's dtype
            (padded tiles' rows included, as transformers returns them).
        Raises:
            ValueError: an input of the wrong shape, dtype or value range (named).
        """
        cfg = self.config
        _check_inputs(cfg, pixel_values, aspect_ratio_ids, aspect_ratio_mask)
        dev, h = self.patch_embedding.weight.device, cfg.hidden_size
        b, tiles, c, s, _ = pixel_values.shape
        ids = aspect_ratio_ids.to(dev, torch.long)
        # patches: [b * tiles, hidden, s / p, s / p] -> x: [b, tiles, num_patches - 1, hidden]
        x = self.patch_embedding(pixel_values.reshape(b * tiles, c, s, s).to(dev, self.dtype))
        x = x.flatten(2).transpose(1, 2).reshape(b, tiles, -1, h)
        x = self.pre_tile_positional_embedding(x, ids)
        cls = self.class_embedding.expand(b, tiles, 1, h)
        x = self.gated_positional_embedding(torch.cat([cls, x], dim=2), ids)
        x = self.layernorm_pre(x)
        p = cfg.num_patches
        length = p + (-p) % _ROW_MULTIPLE
        # x: [b, tiles, length, hidden] -> [b, tiles * length, hidden]
        x = F.pad(x, (0, 0, 0, length - p)).reshape(b, tiles * length, h)
        bias = attention_bias(aspect_ratio_mask.to(dev), p, length, self.dtype)
        x, kept = self._local(x, bias)
        x = self.layernorm_post(x).reshape(b, tiles, length, h)
        x = self.post_tile_positional_embedding(x, ids).reshape(b, tiles * length, h)
        for layer in self.global_transformer.layers:
            x = layer(x, bias)
        # kept: [b, tiles * length, hidden, k] -> [b, tiles, length, hidden * k] (k fastest)
        kept = kept.reshape(b, tiles, length, -1)
        out = torch.cat([x.reshape(b, tiles, length, h), kept], dim=-1)
        return out[:, :, :p].contiguous()

    def _local(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The local transformer: (final state, the intermediate outputs stacked on a new last
        dim in intermediate_layers_indices order)."""
        layers = self.transformer.layers
        n = len(layers)
        want = [i % n for i in self.config.intermediate_layers_indices]
        states: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(layers):
            x = layer(x, bias)
            if i in want:
                states[i] = x
        return x, torch.stack([states[i] for i in want], dim=-1)


def _check_inputs(cfg: MllamaVisionConfig, pixel_values: torch.Tensor,
                  aspect_ratio_ids: torch.Tensor, aspect_ratio_mask: torch.Tensor) -> None:
    want = (cfg.max_num_tiles, cfg.num_channels, cfg.image_size, cfg.image_size)
    if (not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 5
            or tuple(pixel_values.shape[1:]) != want or pixel_values.shape[0] < 1
            or not pixel_values.is_floating_point()):
        got = (f"{pixel_values.dtype} {list(pixel_values.shape)}"
               if isinstance(pixel_values, torch.Tensor) else type(pixel_values).__name__)
        raise ValueError(f"pixel_values: expected a floating tensor [num_images >= 1, "
                         f"{', '.join(map(str, want))}] (max_num_tiles, num_channels, "
                         f"image_size, image_size), got {got}")
    b = pixel_values.shape[0]
    _check_ids(cfg, aspect_ratio_ids, b)
    if (not isinstance(aspect_ratio_mask, torch.Tensor)
            or tuple(aspect_ratio_mask.shape) != (b, cfg.max_num_tiles)):
        got = (list(aspect_ratio_mask.shape) if isinstance(aspect_ratio_mask, torch.Tensor)
               else type(aspect_ratio_mask).__name__)
        raise ValueError(f"aspect_ratio_mask: expected [num_images = {b}, max_num_tiles = "
                         f"{cfg.max_num_tiles}], got {got}")
    if not bool(((aspect_ratio_mask == 0) | (aspect_ratio_mask == 1)).all()):
        raise ValueError("aspect_ratio_mask: expected 0/1 values (1 for an image's real tiles)")


def _check_ids(cfg: MllamaVisionConfig, ids: Optional[torch.Tensor], b: int) -> None:
    if (not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (b,)
            or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
        got = (f"{ids.dtype} {list(ids.shape)}" if isinstance(ids, torch.Tensor)
               else type(ids).__name__)
        raise ValueError(f"aspect_ratio_ids: expected an integer tensor [num_images = {b}], "
                         f"got {got}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi > cfg.max_aspect_ratio_id:
        raise ValueError(f"aspect_ratio_ids: values {lo}..{hi} outside [0, "
                         f"{cfg.max_aspect_ratio_id}] (max_aspect_ratio_id = "
                         f"len(supported_aspect_ratios))")
