"""LLaVA (llava-1.5 layout): CLIP vision tower -> projector -> Llama decoder on the paged cache.

An image becomes `num_image_tokens` embeddings (CLIP hidden states of `vision_feature_layer`,
the class token dropped under the "default" strategy, through linear -> act -> linear). In the
prompt the image's placeholder token is expanded to that many positions (pagedllm.multimodal);
the decoder embeds the prompt's token ids and those positions take the image embeddings
instead, then it runs exactly as for text: the image positions' K/V are written into the
prompt's ordinary KV blocks. `encode_images` and the decoder step are separate calls so the
engine can cache encoder outputs by image content (pagedllm.multimodal.encoder_cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import nn

from pagedllm.model.attention import AttentionMetadata
from pagedllm.model.clip_vision import ACTIVATIONS, ClipVisionConfig, ClipVisionTower, activation
from pagedllm.model.config import ModelConfig
from pagedllm.model.kv_cache import PagedKVCache
from pagedllm.model.llama import LlamaForCausalLM

LLAVA_ARCHITECTURES = ("LlavaForConditionalGeneration",)
SELECT_STRATEGIES = ("default", "full")


@dataclass(frozen=True)
class LlavaConfig:
    """The multimodal part of a LLaVA config.json; `text` is the decoder's ModelConfig."""

    text: ModelConfig
    vision: ClipVisionConfig
    image_token_id: int
    vision_feature_layers: tuple[int, ...] = (-2,)
    vision_feature_select_strategy: str = "default"
    projector_hidden_act: str = "gelu"
    projector_bias: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.image_token_id < self.text.vocab_size:
            raise ValueError(f"image_token_index = {self.image_token_id} is outside the "
                             f"vocabulary [0, {self.text.vocab_size})")
        if self.vision_feature_select_strategy not in SELECT_STRATEGIES:
            raise ValueError(f"vision_feature_select_strategy = "
                             f"{self.vision_feature_select_strategy!r}: expected one of "
                             f"{', '.join(SELECT_STRATEGIES)}")
        if self.projector_hidden_act not in ACTIVATIONS:
            raise ValueError(f"projector_hidden_act = {self.projector_hidden_act!r}: expected "
                             f"one of {', '.join(ACTIVATIONS)}")
        n = self.vision.num_hidden_layers
        for layer in self.vision_feature_layers:
            if not -(n + 1) <= layer <= n:
                raise ValueError(f"vision_feature_layer = {layer}: the vision tower has {n} "
                                 f"layers (hidden states {-(n + 1)}..{n})")

    @property
    def num_image_tokens(self) -> int:
        """Placeholder positions (and embeddings) per image."""
        extra = 1 if self.vision_feature_select_strategy == "full" else 0
        return self.vision.num_patches + extra

    @property
    def projector_in(self) -> int:
        return self.vision.hidden_size * len(self.vision_feature_layers)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any],
                  generation_config: Optional[Mapping[str, Any]] = None) -> "LlavaConfig":
        """Parses a LlavaForConditionalGeneration config.json dict.

        Raises:
            ValueError: a missing, mistyped or unsupported field (named).
        """
        archs = d.get("architectures") or []
        if not any(a in LLAVA_ARCHITECTURES for a in archs) and d.get("model_type") != "llava":
            raise ValueError(f"architectures = {archs!r}: expected {list(LLAVA_ARCHITECTURES)}")
        text_d = d.get("text_config")
        if not isinstance(text_d, Mapping):
            raise ValueError("text_config: expected an object (the Llama decoder's config)")
        text_d = {"model_type": "llama", **text_d, "architectures": ["LlamaForCausalLM"]}
        text = ModelConfig.from_dict(text_d, generation_config)
        vision = ClipVisionConfig.from_dict(d.get("vision_config", {}))
        token = d.get("image_token_index", d.get("image_token_id"))
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError(f"image_token_index = {token!r}: expected an integer token id")
        layers = d.get("vision_feature_layer", -2)
        layers = tuple(layers) if isinstance(layers, list) else (layers,)
        if not layers or any(isinstance(x, bool) or not isinstance(x, int) for x in layers):
            raise ValueError(f"vision_feature_layer = {d.get('vision_feature_layer')!r}: expected "
                             f"an integer or a non-empty list of integers")
        bias = d.get("multimodal_projector_bias", True)
        if not isinstance(bias, bool):
            raise ValueError(f"multimodal_projector_bias = {bias!r}: expected true or false")
        return cls(text=text, vision=vision, image_token_id=token, vision_feature_layers=layers,
                   vision_feature_select_strategy=d.get("vision_feature_select_strategy",
                                                        "default"),
                   projector_hidden_act=d.get("projector_hidden_act", "gelu"),
                   projector_bias=bias)


class LlavaProjector(nn.Module):
    """linear_2(act(linear_1(x))): vision features -> the decoder's hidden size."""

    def __init__(self, cfg: LlavaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h = cfg.text.hidden_size
        self.act = cfg.projector_hidden_act
        self.linear_1 = nn.Linear(cfg.projector_in, h, bias=cfg.projector_bias, dtype=dtype)
        self.linear_2 = nn.Linear(h, h, bias=cfg.projector_bias, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., projector_in] -> [..., text hidden_size]
        return self.linear_2(activation(self.act, self.linear_1(x)))


class LlavaForConditionalGeneration(nn.Module):
    """The LLaVA model: `encode_images` for the encoder, `forward` for one decoder step.

    Args:
        cfg: the LLaVA config.
        dtype: parameter dtype (uninitialised: load_llava fills them).
    """

    def __init__(self, cfg: LlavaConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.llava_config = cfg
        self.config = cfg.text
        self.dtype = dtype
        self.vision_tower = ClipVisionTower(cfg.vision, dtype)
        self.multi_modal_projector = LlavaProjector(cfg, dtype)
        self.multi_modal_projector.requires_grad_(False)
        self.language_model = LlamaForCausalLM(cfg.text, dtype)

    def prepack_weights(self) -> int:
        """Prepacks the decoder's projections (LlamaForCausalLM.prepack_weights)."""
        return self.language_model.prepack_weights()

    @torch.inference_mode()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """The decoder-space embeddings of a batch of preprocessed images.

        Args:
            pixels: [num_images, channels, image_size, image_size] float.
        Returns:
            [num_images, num_image_tokens, text hidden_size] in the model dtype.
        """
        cfg = self.llava_config
        states = self.vision_tower(pixels, cfg.vision_feature_layers)
        if cfg.vision_feature_select_strategy == "default":
            states = [s[:, 1:] for s in states]
        feats = states[0] if len(states) == 1 else torch.cat(states, dim=-1)
        return self.multi_modal_projector(feats)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: PagedKVCache, mm_rows: Optional[torch.Tensor] = None,
                mm_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One decoder step (LlamaForCausalLM.forward) with image embeddings at some rows.

        Args:
            input_ids: [num_tokens] int64 (image positions hold the image token id).
            positions, meta, kv: as for LlamaForCausalLM.forward.
            mm_rows: [k] int64, packed rows that take image embeddings (None: text only).
            mm_embeds: [k, hidden_size], those embeddings, in mm_rows' order.
        Returns:
            hidden: [num_tokens, hidden_size], final norm applied.
        """
        lm = self.language_model
        x = lm.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        if mm_rows is not None and mm_rows.numel():
            x[mm_rows] = mm_embeds.to(x.dtype)
        return lm(input_ids, positions, meta, kv, inputs_embeds=x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of rows of forward's output: [n, hidden_size] -> [n, vocab_size] float32."""
        return self.language_model.compute_logits(hidden)
