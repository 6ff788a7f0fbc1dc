"""Fixtures of the Mllama tests: tiny random config dicts, transformers models built from them,
and tiny checkpoints written by transformers itself (nothing is downloaded).

transformers initialises every tanh gate of Mllama to zero (the tile and position embeddings'
gates, the global layers' are small, the text model's cross-attention gates), which would hide
whole branches from a parity test; `randomize_gates_` opens them all.
"""

from __future__ import annotations

import functools
from typing import Any, List, Optional, Sequence

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


# --- the decoder, the engine and the API against transformers (test_mllama_*.py) ---------------
NUM_PATCHES = (TILE // PATCH) ** 2 + 1  # vision tokens per tile
CROSS_LAYERS = (1, 3)


def engine_test_config() -> dict:
    """The engine tests' config.json dict: 4 decoder layers, 2 of them cross-attention (so the
    self and cross pools' layer numbering is exercised)."""
    return tiny_mllama_config(text=tiny_text_config(4, CROSS_LAYERS))


def gpu_test_config() -> dict:
    """engine_test_config() with head_dim 64 (hidden 256, 4 heads), the smallest head the CUDA
    kernels are compiled for (the CPU tests' 16 is refused on a GPU)."""
    return tiny_mllama_config(text=tiny_text_config(4, CROSS_LAYERS, hidden_size=256,
                                                    intermediate_size=512))


def tiny_hf_model(seed: int = 0):
    """transformers' MllamaForConditionalGeneration of engine_test_config(), gates open."""
    return hf_mllama_model(engine_test_config(), seed)


def write_test_checkpoint(path: str, seed: int = 0) -> str:
    """write_tiny_mllama of engine_test_config()."""
    return write_tiny_mllama(path, engine_test_config(), seed)


def load_text_weights(ours: torch.nn.Module, hf_model, cfg) -> None:
    """Copies transformers' decoder and projector weights into pagedllm's model through the
    loader's own name table."""
    from pagedllm.model.mllama_loader import canonical_name, expected_text_tensors

    slots = expected_text_tensors(cfg)
    params = dict(ours.named_parameters())
    for name, t in hf_model.state_dict().items():
        canon = canonical_name(name)
        if canon.startswith("vision_model.") or canon.endswith("rotary_emb.inv_freq"):
            continue
        slot = slots[canon]
        assert tuple(t.shape) == slot.shape, (name, t.shape, slot.shape)
        dst = params[slot.param]
        dst.data[slot.row_offset:slot.row_offset + t.shape[0]].copy_(t)


def hf_token_mask(ids: Sequence[int], num_tiles: Sequence[int], max_tiles: int = MAX_TILES
                  ) -> torch.Tensor:
    """transformers' cross_attention_mask [1, len(ids), num_images, max_tiles] of a prompt."""
    from transformers.models.mllama.processing_mllama import (
        convert_sparse_cross_attention_mask_to_dense, get_cross_attention_token_mask)

    sparse = get_cross_attention_token_mask(list(ids), IMAGE_TOKEN)
    dense = convert_sparse_cross_attention_mask_to_dense([sparse], [list(num_tiles)], max_tiles,
                                                         len(ids))
    return torch.from_numpy(dense)


def token_ranges(ids: Sequence[int], tokens_per_image: Sequence[int]) -> List[List[int]]:
    """The independent reference of the [lo, hi) cross-token range of every prompt token:
    transformers' token mask, image by image, flattened to contiguous cross tokens."""
    mask = hf_token_mask(ids, [1] * len(tokens_per_image))[0, :, :, 0].numpy()  # [len, imgs]
    starts = np.concatenate([[0], np.cumsum(tokens_per_image)])
    out = []
    for row in mask:
        seen = np.nonzero(row)[0]
        out.append([0, 0] if not len(seen) else [int(starts[seen[0]]),
                                                 int(starts[seen[-1] + 1])])
    return out


@functools.lru_cache(maxsize=4)
def _hf(path: str):
    from transformers import MllamaForConditionalGeneration, MllamaImageProcessorPil

    model = MllamaForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    return model, MllamaImageProcessorPil.from_pretrained(path)


def _hf_inputs(path: str, prompt: Sequence[int], images: Sequence) -> tuple:
    model, proc = _hf(path)
    ids = torch.tensor([list(prompt)])
    if not images:
        return model, ids, {}
    o = proc([list(images)], return_tensors="pt")
    extra = {"pixel_values": o["pixel_values"], "aspect_ratio_ids": o["aspect_ratio_ids"],
             "aspect_ratio_mask": o["aspect_ratio_mask"],
             "cross_attention_mask": hf_token_mask(prompt, o["num_tiles"][0])}
    return model, ids, extra


def hf_greedy(path: str, prompt: Sequence[int], images: Sequence,
              max_tokens: int) -> tuple:
    """transformers' greedy continuation (EOS ignored) and its log-probabilities
    [max_tokens, vocab] of a prompt with `<|image|>` tokens."""
    model, ids, extra = _hf_inputs(path, prompt, images)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **extra,
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=None,
                             output_logits=True, return_dict_in_generate=True)
    logprobs = torch.log_softmax(torch.cat(out.logits).float(), dim=-1)
    return out.sequences[0, ids.shape[1]:].tolist(), logprobs


def hf_logprobs(path: str, prompt: Sequence[int], images: Sequence,
                continuation: Sequence[int]) -> torch.Tensor:
    """log_softmax of transformers' logits after the prompt and each continuation token but
    the last: [len(continuation), vocab] (one forward; generated rows see what the last
    prompt token sees, as in generate)."""
    model, ids, extra = _hf_inputs(path, prompt, images)
    full = torch.cat([ids, torch.tensor([list(continuation)])], dim=1)
    if "cross_attention_mask" in extra:
        m = extra["cross_attention_mask"]
        tail = m[:, -1:].repeat(1, len(continuation), 1, 1)
        extra = {**extra, "cross_attention_mask": torch.cat([m, tail], dim=1)}
    with torch.inference_mode():
        logits = model(input_ids=full, **extra).logits[0].float()
    start = ids.shape[1] - 1
    return torch.log_softmax(logits[start:start + len(continuation)], dim=-1)


def text_prompt(n: int, seed: int) -> List[int]:
    """n random text token ids (never the image token)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, VOCAB, n)]


def assert_pools_clean(llm) -> None:
    """Both pools back to full (free or cached blocks only, no sequence left)."""
    from engine_fixtures import assert_pool_clean

    assert_pool_clean(llm)
    s = llm.engine.images.cross.kv.stats()
    assert s["used_blocks"] == 0 and s["num_seqs"] == 0, s
    assert s["free_blocks"] + s["cached_blocks"] == s["num_blocks"], s
