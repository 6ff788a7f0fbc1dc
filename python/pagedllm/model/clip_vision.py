"""The CLIP vision tower of a LLaVA checkpoint, in torch (transformers' CLIPVisionModel numerics).

Patch embedding (a stride-`patch_size` convolution without bias) + a class token + learned
position embeddings -> `pre_layrnorm` (sic: the checkpoint's name) -> pre-norm encoder layers
(LayerNorm -> bidirectional multi-head attention with biases -> residual -> LayerNorm -> fc1 ->
activation -> fc2 -> residual). LLaVA reads the hidden states after a chosen layer
(`vision_feature_layer`, negative counts from the end as in transformers' `hidden_states`
tuple, whose entry 0 is the embeddings after `pre_layrnorm`), so only the layers up to the
deepest one asked for are run; `post_layernorm` is loaded and never applied (LLaVA does not).
Every operation is the one transformers runs in float32; attention goes through
F.scaled_dot_product_attention (transformers' default "sdpa" path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh", "gelu_new")
_MAX_DIM = 1 << 15
_MAX_LAYERS = 256


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """transformers' ACT2FN[name](x) for the activations CLIP and LLaVA projectors use."""
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "gelu":
        return F.gelu(x)
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return F.gelu(x, approximate="tanh")
    raise ValueError(f"activation {name!r}: expected one of {', '.join(ACTIVATIONS)}")


@dataclass(frozen=True)
class ClipVisionConfig:
    """config.json's `vision_config` (model_type clip_vision_model), validated on construction."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "image_size", "patch_size", "num_channels"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"vision_config.{name} = {v!r}: expected a positive integer")
            limit = _MAX_LAYERS if name == "num_hidden_layers" else _MAX_DIM
            if v > limit:
                raise ValueError(f"vision_config.{name} = {v}: expected at most {limit}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"vision_config.hidden_size = {self.hidden_size} is not a multiple "
                             f"of num_attention_heads = {self.num_attention_heads}")
        if self.image_size % self.patch_size:
            raise ValueError(f"vision_config.image_size = {self.image_size} is not a multiple of "
                             f"patch_size = {self.patch_size}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"vision_config.hidden_act = {self.hidden_act!r}: expected one of "
                             f"{', '.join(ACTIVATIONS)}")

    @property
    def num_patches(self) -> int:
        """Patches per image: (image_size / patch_size)^2 (the class token not counted)."""
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ClipVisionConfig":
        """Parses a `vision_config` dict (transformers' CLIPVisionConfig defaults for the rest).

        Raises:
            ValueError: a missing, mistyped or unsupported field (named).
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"vision_config = {d!r}: expected an object")
        mt = d.get("model_type", "clip_vision_model")
        if mt not in ("clip_vision_model", "clip"):
            raise ValueError(f"vision_config.model_type = {mt!r}: only 'clip_vision_model' "
                             f"(CLIP) vision towers are supported")
        defaults = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                        num_attention_heads=12, image_size=224, patch_size=32, num_channels=3,
                        layer_norm_eps=1e-5, hidden_act="quick_gelu")
        kw = {k: d.get(k, v) for k, v in defaults.items()}
        eps = kw["layer_norm_eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"vision_config.layer_norm_eps = {eps!r}: expected a positive number")
        kw["layer_norm_eps"] = float(eps)
        return cls(**kw)


def clip_tensor_shapes(cfg: ClipVisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a CLIP vision tower checkpoint (names under `vision_tower.`), with its
    shape; these are also the parameter names of ClipVisionTower."""
    h, f, p, c = cfg.hidden_size, cfg.intermediate_size, cfg.patch_size, cfg.num_channels
    out: dict[str, tuple[int, ...]] = {
        "embeddings.class_embedding": (h,),
        "embeddings.patch_embedding.weight": (h, c, p, p),
        "embeddings.position_embedding.weight": (cfg.num_patches + 1, h),
        "pre_layrnorm.weight": (h,), "pre_layrnorm.bias": (h,),
    }
    for i in range(cfg.num_hidden_layers):
        pre = f"encoder.layers.{i}"
        for ln in ("layer_norm1", "layer_norm2"):
            out[f"{pre}.{ln}.weight"] = (h,)
            out[f"{pre}.{ln}.bias"] = (h,)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[f"{pre}.self_attn.{proj}.weight"] = (h, h)
            out[f"{pre}.self_attn.{proj}.bias"] = (h,)
        out[f"{pre}.mlp.fc1.weight"] = (f, h)
        out[f"{pre}.mlp.fc1.bias"] = (f,)
        out[f"{pre}.mlp.fc2.weight"] = (h, f)
        out[f"{pre}.mlp.fc2.bias"] = (h,)
    out["post_layernorm.weight"] = (h,)
    out["post_layernorm.bias"] = (h,)
    return out


class _Embeddings(nn.Module):
    def __init__(self, cfg: ClipVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.class_embedding = nn.Parameter(torch.empty(h, dtype=dtype), requires_grad=False)
        self.patch_embedding = nn.Conv2d(cfg.num_channels, h, cfg.patch_size, cfg.patch_size,
                                         bias=False, dtype=dtype)
        self.position_embedding = nn.Embedding(cfg.num_patches + 1, h, dtype=dtype)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # pixels: [B, C, S, S] -> patches: [B, hidden, S/p, S/p] -> [B, num_patches, hidden]
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))
        patches = patches.flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(pixels.shape[0], 1, -1)
        # x: [B, num_patches + 1, hidden]
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class _Attention(nn.Module):
    def __init__(self, cfg: ClipVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(h, h, dtype=dtype) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, T, hidden] -> q, k, v: [B, heads, T, head_dim]
        b, t, h = x.shape
        q, k, v = (p(x).view(b, t, self.num_heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)  # non-causal, scale head_dim^-0.5
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h))


class VisionMlp(nn.Module):
    """fc2(act(fc1(x))), the MLP of a vision encoder layer (CLIP's, and Mllama's).

    Args:
        cfg: a vision config with hidden_size, intermediate_size and hidden_act (one of
            ACTIVATIONS): ClipVisionConfig or MllamaVisionConfig.
        dtype: the weights' dtype.
    """

    def __init__(self, cfg: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.act = cfg.hidden_act
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, dtype=dtype)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., hidden] -> [..., intermediate] -> [..., hidden]
        return self.fc2(activation(self.act, self.fc1(x)))


class _EncoderLayer(nn.Module):
    def __init__(self, cfg: ClipVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(h, eps=eps, dtype=dtype)
        self.self_attn = _Attention(cfg, dtype)
        self.layer_norm2 = nn.LayerNorm(h, eps=eps, dtype=dtype)
        self.mlp = VisionMlp(cfg, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class _Encoder(nn.Module):
    def __init__(self, cfg: ClipVisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_EncoderLayer(cfg, dtype)
                                    for _ in range(cfg.num_hidden_layers))


class ClipVisionTower(nn.Module):
    """CLIPVisionModel's transformer, returning the hidden states LLaVA selects.

    Args:
        cfg: the vision config.
        dtype: parameter dtype (parameters are uninitialised: the LLaVA loader fills them).
    """

    def __init__(self, cfg: ClipVisionConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        h = cfg.hidden_size
        self.embeddings = _Embeddings(cfg, dtype)
        self.pre_layrnorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps, dtype=dtype)
        self.encoder = _Encoder(cfg, dtype)
        self.post_layernorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps, dtype=dtype)  # unused
        self.requires_grad_(False)

    def layer_index(self, layer: int) -> int:
        """transformers' hidden_states index `layer` (negative from the end) as 0..num_layers.

        Raises:
            ValueError: outside [-(num_layers + 1), num_layers].
        """
        n = self.config.num_hidden_layers
        if not -(n + 1) <= layer <= n:
            raise ValueError(f"vision_feature_layer = {layer}: the vision tower has {n} layers "
                             f"(hidden states {-(n + 1)}..{n})")
        return layer if layer >= 0 else n + 1 + layer

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        """Runs the tower as deep as the deepest requested hidden state.

        Args:
            pixels: [B, num_channels, image_size, image_size], preprocessed.
            layers: hidden-state indices (transformers' convention, may be negative).
        Returns:
            One [B, num_patches + 1, hidden_size] tensor per entry of `layers`.
        """
        want = [self.layer_index(i) for i in layers]
        x = self.pre_layrnorm(self.embeddings(pixels))
        states = {0: x}
        for i, layer in enumerate(self.encoder.layers[:max(want)], start=1):
            x = layer(x)
            states[i] = x
        return [states[i] for i in want]
