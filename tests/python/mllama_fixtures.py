"""Fixtures of the Mllama tests: tiny random config dicts, transformers models built from them,
and tiny checkpoints written by transformers itself (nothing is downloaded).

transformers initialises every tanh gate of Mllama to zero (the tile and position embeddings'
gates, the global layers' are small, the text model's cross-attention gates), which would hide
whole branches from a parity test; `randomize_gates_` opens them all.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import numpy as np
import torch

VOCAB = 256
IMAGE_TOKEN = VOCAB  # as Llama 3.2 Vision: the image token is the first of the 8 extra embeddings
TILE = 28            # tile side in pixels
PATCH = 14           # 4 patches per tile + the class token = 5 positions (padded to 8)
MAX_TILES = 4
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
_GATE_SUFFIXES = ("gate", "gate_attn", "gate_ffn", "cross_attn_attn_gate",
                  "cross_attn_mlp_gate")


def tiny_vision_config(image_size: int = TILE, patch_size: int = PATCH, hidden_size: int = 32,
                       num_hidden_layers: int = 3, num_global_layers: int = 2,
                       intermediate_layers_indices: Sequence[int] = (0, 2),
                       max_num_tiles: int = MAX_TILES, **extra: Any) -> dict:
    """A Mllama `vision_config` dict (config.json form) of a tiny encoder."""
    d = dict(model_type="mllama_vision_model", hidden_size=hidden_size,
             intermediate_size=2 * hidden_size, num_hidden_layers=num_hidden_layers,
             num_global_layers=num_global_layers, attention_heads=4, num_channels=3,
             vision_output_dim=hidden_size * (1 + len(intermediate_layers_indices)),
             image_size=image_size, patch_size=patch_size, norm_eps=1e-5,
             max_num_tiles=max_num_tiles,
             intermediate_layers_indices=list(intermediate_layers_indices),
             initializer_range=0.1, hidden_act="gelu")
    if max_num_tiles != 4:  # transformers' get_all_supported_aspect_ratios order
        d["supported_aspect_ratios"] = [[w, h] for w in range(1, max_num_tiles + 1)
                                        for h in range(1, max_num_tiles + 1)
                                        if w * h <= max_num_tiles]
    d.update(extra)
    return d


def tiny_text_config(num_hidden_layers: int = 3, cross_attention_layers: Sequence[int] = (1,),
                     **extra: Any) -> dict:
    """A Mllama `text_config` dict: a tiny decoder with cross-attention layers."""
    d = dict(model_type="mllama_text_model", vocab_size=VOCAB, hidden_size=64,
             intermediate_size=128, num_hidden_layers=num_hidden_layers,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
             max_position_embeddings=512, cross_attention_layers=list(cross_attention_layers),
             initializer_range=0.1, rope_parameters={"rope_type": "default",
                                                     "rope_theta": 10000.0},
             bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    d.update(extra)
    return d


def tiny_mllama_config(text: Optional[dict] = None, vision: Optional[dict] = None) -> dict:
    """A MllamaForConditionalGeneration config.json dict (text 3 layers, layer 1 cross)."""
    return dict(architectures=["MllamaForConditionalGeneration"], model_type="mllama",
                text_config=text or tiny_text_config(),
                vision_config=vision or tiny_vision_config(),
                image_token_index=IMAGE_TOKEN)


def tiny_preprocessor_config(tile: int = TILE, max_image_tiles: int = MAX_TILES,
                             **extra: Any) -> dict:
    """preprocessor_config.json of MllamaImageProcessor for `tile`-pixel tiles."""
    d = dict(image_processor_type="MllamaImageProcessor", do_convert_rgb=True, do_normalize=True,
             do_pad=True, do_rescale=True, do_resize=True, image_mean=list(IMAGE_MEAN),
             image_std=list(IMAGE_STD), max_image_tiles=max_image_tiles, resample=2,
             rescale_factor=1 / 255, size={"height": tile, "width": tile})
    d.update(extra)
    return d


def randomize_gates_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Sets every Mllama tanh gate of `model` to a random value in +-[0.3, 1.2]."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in _GATE_SUFFIXES:
                mag = 0.3 + 0.9 * torch.rand(p.shape, generator=g)
                sign = torch.where(torch.rand(p.shape, generator=g) < 0.5, -1.0, 1.0)
                p.copy_(mag * sign)
    return model


def hf_vision_model(vision: dict, seed: int = 0):
    """transformers' MllamaVisionModel with random weights (gates open), float32, eval."""
    from transformers import MllamaVisionConfig, MllamaVisionModel

    torch.manual_seed(seed)
    cfg = MllamaVisionConfig(**{k: v for k, v in vision.items() if k != "model_type"})
    return randomize_gates_(MllamaVisionModel(cfg), seed).eval()


def hf_mllama_model(config: Optional[dict] = None, seed: int = 0):
    """transformers' MllamaForConditionalGeneration with random weights (gates open)."""
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    config = config or tiny_mllama_config()
    torch.manual_seed(seed)
    cfg = MllamaConfig(text_config=config["text_config"], vision_config=config["vision_config"],
                       image_token_index=config["image_token_index"])
    return randomize_gates_(MllamaForConditionalGeneration(cfg), seed).eval()


def write_tiny_mllama(path: str, config: Optional[dict] = None, seed: int = 0,
                      preprocessor: Optional[dict] = None) -> str:
    """Writes a random Mllama checkpoint (transformers' save_pretrained) plus its
    preprocessor_config.json to `path`; returns `path`."""
    from transformers import MllamaImageProcessorPil

    hf_mllama_model(config, seed).save_pretrained(path)
    proc = preprocessor or tiny_preprocessor_config(
        tile=(config or tiny_mllama_config())["vision_config"]["image_size"])
    MllamaImageProcessorPil(**{k: v for k, v in proc.items()
                               if k != "image_processor_type"}).save_pretrained(path)
    return str(path)


@functools.lru_cache(maxsize=8)
def hf_image_processor(tile: int = TILE, max_image_tiles: int = MAX_TILES):
    """transformers' MllamaImageProcessorPil for tiny tiles (the processor reference)."""
    from transformers import MllamaImageProcessorPil

    proc = tiny_preprocessor_config(tile, max_image_tiles)
    return MllamaImageProcessorPil(**{k: v for k, v in proc.items()
                                      if k != "image_processor_type"})


def random_image(seed: int, size=(40, 33), mode: str = "RGB"):
    """A random PIL image of (width, height) `size` in `mode` (RGB, RGBA or L)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    data = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(data[..., 0] if channels == 1 else data)
