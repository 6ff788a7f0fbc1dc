"""MllamaConfig: the validated top level of an MllamaForConditionalGeneration config.json.

`text` is the decoder's ModelConfig over ALL its layers (from `text_config`), `self_text` the
same with only the self-attention layers (what the ordinary KV pool is sized from: the
cross-attention layers keep their K/V in a pool of their own), `cross_attention_layers` the
decoder indices of the cross-attention layers, `vision` the vision encoder's validated
MllamaVisionConfig. The engine's host side reads it to find `<|image|>` tokens and count
vision tokens; model/mllama.py builds the modules from it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pagedllm.model.composite_config import names_architecture, read_composite_config
from pagedllm.model.config import ModelConfig
from pagedllm.model.mllama_vision_config import MllamaVisionConfig

MLLAMA_ARCHITECTURES = ("MllamaForConditionalGeneration",)
_DEFAULT_CROSS_LAYERS = (3, 8, 13, 18, 23, 28, 33, 38)
EMBED_EXTRA_ROWS = 8  # transformers' MllamaTextModel embeds vocab_size + 8 ids


def _int(name: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} = {v!r}: expected an integer >= {lo}")
    return v


@dataclass(frozen=True)
class MllamaConfig:
    """The parts of an Mllama config.json the engine and the model use.

    Attributes:
        text: the decoder's ModelConfig, every layer.
        cross_attention_layers: sorted decoder indices of the cross-attention layers.
        image_token_id: the `<|image|>` id (may equal text.vocab_size: it is embedded, never
            sampled).
        vision: the vision encoder's config.
    """

    text: ModelConfig
    cross_attention_layers: tuple[int, ...]
    image_token_id: int
    vision: MllamaVisionConfig

    def __post_init__(self) -> None:
        n = self.text.num_hidden_layers
        layers = self.cross_attention_layers
        if any(not 0 <= i < n for i in layers) or len(set(layers)) != len(layers):
            raise ValueError(f"cross_attention_layers = {list(layers)}: expected distinct "
                             f"indices of the {n} decoder layers")
        if len(layers) == n:
            raise ValueError("cross_attention_layers lists every decoder layer: expected at "
                             "least one self-attention layer")
        if not 0 <= self.image_token_id < self.text.vocab_size + EMBED_EXTRA_ROWS:
            raise ValueError(f"image_token_index = {self.image_token_id} is outside the "
                             f"embedding [0, {self.text.vocab_size + EMBED_EXTRA_ROWS})")
        if self.text.tie_word_embeddings:
            raise ValueError("text_config.tie_word_embeddings = true: Mllama's embedding has "
                             "vocab_size + 8 rows and lm_head vocab_size; expected false")

    @property
    def self_text(self) -> ModelConfig:
        """The decoder's ModelConfig with only its self-attention layers (the KV pool's)."""
        return dataclasses.replace(
            self.text, num_hidden_layers=self.text.num_hidden_layers - len(
                self.cross_attention_layers))

    @property
    def cross_text(self) -> ModelConfig:
        """The decoder's ModelConfig with only its cross-attention layers (the cross pool's)."""
        return dataclasses.replace(self.text,
                                   num_hidden_layers=len(self.cross_attention_layers))

    @property
    def num_patches(self) -> int:
        """Vision tokens per tile: (image_size / patch_size)^2 + the class token."""
        return self.vision.num_patches

    @property
    def max_num_tiles(self) -> int:
        return self.vision.max_num_tiles

    @property
    def vision_output_dim(self) -> int:
        return self.vision.vision_output_dim

    @classmethod
    def from_dict(cls, d: Mapping[str, Any],
                  generation_config: Optional[Mapping[str, Any]] = None) -> "MllamaConfig":
        """Parses an MllamaForConditionalGeneration config.json dict.

        Raises:
            ValueError: a missing, mistyped or unsupported field (named).
        """
        archs = d.get("architectures") or []
        if not any(a in MLLAMA_ARCHITECTURES for a in archs) and d.get("model_type") != "mllama":
            raise ValueError(f"architectures = {archs!r}: expected {list(MLLAMA_ARCHITECTURES)}")
        text_d = d.get("text_config")
        vision_d = d.get("vision_config")
        if not isinstance(text_d, Mapping) or not isinstance(vision_d, Mapping):
            raise ValueError("text_config / vision_config: expected objects (the decoder's and "
                             "the vision model's configs)")
        layers = text_d.get("cross_attention_layers", list(_DEFAULT_CROSS_LAYERS))
        if not isinstance(layers, list) or not layers:
            raise ValueError(f"text_config.cross_attention_layers = {layers!r}: expected a "
                             f"non-empty list of layer indices")
        layers = tuple(sorted(_int("text_config.cross_attention_layers[]", i, 0)
                              for i in layers))
        text_d = {**text_d, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
        text = ModelConfig.from_dict(text_d, generation_config)
        token = d.get("image_token_index", d.get("image_token_id", 128256))
        return cls(text=text, cross_attention_layers=layers,
                   image_token_id=_int("image_token_index", token, 0),
                   vision=MllamaVisionConfig.from_dict(vision_d))


def is_mllama_checkpoint(path: str | os.PathLike) -> bool:
    """True when `path`/config.json names an Mllama architecture (a cheap peek, no validation)."""
    return names_architecture(path, MLLAMA_ARCHITECTURES, "mllama")


def read_mllama_config(path: str | os.PathLike) -> MllamaConfig:
    """config.json (+ generation_config.json) of an Mllama directory, validated.

    Raises:
        CheckpointError: a missing, unreadable or invalid file (named).
    """
    return read_composite_config(path, MllamaConfig.from_dict)
