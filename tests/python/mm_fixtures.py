"""Fixtures of the multimodal tests: tiny random LLaVA checkpoints and transformers' answers.

The checkpoints are made here by transformers itself (LlavaForConditionalGeneration with a
CLIPVisionConfig + LlamaConfig, save_pretrained, plus CLIPImageProcessor's
preprocessor_config.json), so the loader is tested against the real layout; nothing is
downloaded. transformers is also the reference: its own processor makes the pixel values and
its own placeholder expansion the input ids.
"""

from __future__ import annotations

import functools
import io
from typing import List, Sequence

import numpy as np
import pytest
import torch

IMAGE_TOKEN = 250
VOCAB = 256
IMAGE_SIZE = 28
PATCH = 7  # 16 patches per image


def write_tiny_llava(path: str, seed: int = 0, strategy: str = "default",
                     feature_layer=-2) -> str:
    """Writes a random LLaVA checkpoint (+ preprocessor_config.json) to `path`."""
    from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration)

    torch.manual_seed(seed)
    vc = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                          num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                          projection_dim=16)
    tc = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=512, initializer_range=0.1, eos_token_id=2,
                     bos_token_id=1)
    cfg = LlavaConfig(vision_config=vc, text_config=tc, image_token_id=IMAGE_TOKEN,
                      vision_feature_layer=feature_layer,
                      vision_feature_select_strategy=strategy)
    model = LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # larger projector weights: images move the logits visibly
        for p in model.model.multi_modal_projector.parameters():
            p.mul_(4.0)
    model.save_pretrained(path)
    CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                          crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def llava_dir(tmp_path_factory) -> str:
    """A tiny random LLaVA checkpoint (no tokenizer: prompts are token ids)."""
    return write_tiny_llava(str(tmp_path_factory.mktemp("llava")))


def random_image(seed: int, size=(40, 33)):
    """A random RGB PIL image."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def png_bytes(image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def text_prompt(n: int, seed: int) -> List[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, IMAGE_TOKEN, n)]


@functools.lru_cache(maxsize=4)
def _hf(path: str):
    from transformers import CLIPImageProcessorPil, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    return model, CLIPImageProcessorPil.from_pretrained(path)


def _hf_inputs(path: str, prompt: Sequence[int], images: Sequence):
    model, proc = _hf(path)
    n = model.config.vision_config.image_size // model.config.vision_config.patch_size
    n = n * n + (1 if model.config.vision_feature_select_strategy == "full" else 0)
    ids: List[int] = []
    for t in prompt:
        ids.extend([t] * n if t == IMAGE_TOKEN else [t])
    pixels = (torch.from_numpy(proc(list(images), return_tensors="np")["pixel_values"])
              if images else None)
    return model, torch.tensor([ids]), pixels


def hf_greedy(path: str, prompt: Sequence[int], images: Sequence, max_tokens: int) -> List[int]:
    """transformers' greedy continuation (EOS ignored) of a prompt with image placeholders."""
    model, ids, pixels = _hf_inputs(path, prompt, images)
    extra = {} if pixels is None else {"pixel_values": pixels}
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **extra,
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, ids.shape[1]:].tolist()


def hf_logprobs(path: str, prompt: Sequence[int], images: Sequence,
                continuation: Sequence[int]) -> torch.Tensor:
    """log_softmax of transformers' logits after the prompt and each continuation token but
    the last: [len(continuation), vocab]."""
    model, ids, pixels = _hf_inputs(path, prompt, images)
    full = torch.cat([ids, torch.tensor([list(continuation)])], dim=1)
    with torch.inference_mode():
        extra = {} if pixels is None else {"pixel_values": pixels}
        logits = model(input_ids=full, **extra).logits[0].float()
    start = ids.shape[1] - 1
    return torch.log_softmax(logits[start:start + len(continuation)], dim=-1)
