"""LlavaConfig: the validated multimodal part of a LLaVA config.json (no torch modules here).

`text` is the Llama decoder's ModelConfig (from `text_config`), `vision` the CLIP tower's
(`vision_config`). The engine's host side (pagedllm.multimodal) reads it to expand image
placeholders; the model side (model/llava.py) builds the modules from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pagedllm.model.clip_vision import ACTIVATIONS, ClipVisionConfig
from pagedllm.model.composite_config import names_architecture, read_composite_config
from pagedllm.model.config import ModelConfig

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


def is_llava_checkpoint(path: str | os.PathLike) -> bool:
    """True when `path`/config.json names a LLaVA architecture (a cheap peek, no validation)."""
    return names_architecture(path, LLAVA_ARCHITECTURES, "llava")


def read_llava_config(path: str | os.PathLike) -> LlavaConfig:
    """config.json (+ generation_config.json) of a LLaVA directory, validated.

    Raises:
        CheckpointError: a missing, unreadable or invalid file (named).
    """
    return read_composite_config(path, LlavaConfig.from_dict)
