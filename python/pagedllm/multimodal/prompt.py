"""A prompt with images -> token ids with expanded placeholders, cache ids and image inputs.

The prompt holds one image placeholder token (LLaVA's `<image>`, config.json's
`image_token_index`) per image, in order; each is expanded to `num_image_tokens` positions
(llava-1.5: the patch count, one more with the "full" feature strategy), as transformers'
LlavaProcessor does. The engine keeps the real ids (the placeholder id at image positions) for
the model, the sampler and outputs; the KV-cache manager gets `kv_token_ids`, where image
positions hold ids derived from the image's content hash (hashing.py). A placeholder count
that differs from the image count, or images for a text-only model, is a ValueError.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from pagedllm.model.llava_config import LlavaConfig, is_llava_checkpoint, read_llava_config
from pagedllm.multimodal.hashing import image_hash, placeholder_cache_ids
from pagedllm.multimodal.image_io import ImageInputError, load_image
from pagedllm.multimodal.limits import MultiModalLimits
from pagedllm.multimodal.processor import ImageProcessorConfig, preprocess


@dataclass(frozen=True)
class ImageInput:
    """One image of a prompt.

    Attributes:
        content_hash: BLAKE2b-128 of the decoded pixels (the encoder cache's key).
        pixel_values: float32 [3, H, W], preprocessed.
        offset: prompt position of its first placeholder.
        length: its placeholder positions (= embeddings the encoder gives).
    """

    content_hash: bytes
    pixel_values: np.ndarray
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class MultiModalPrompt:
    """A prompt's expanded token ids, its prefix-cache ids and its images (in order)."""

    token_ids: List[int]
    kv_token_ids: np.ndarray  # int32 [len(token_ids)]
    images: tuple


class ImagePromptProcessor:
    """Expands and preprocesses the images of prompts for one LLaVA checkpoint.

    Args:
        config: the checkpoint's LlavaConfig.
        image_config: its preprocessing (preprocessor_config.json).
        limits: per-prompt image limits.
    Raises:
        ValueError: the preprocessing's output size is not the vision tower's image size.
    """

    def __init__(self, config: LlavaConfig, image_config: ImageProcessorConfig,
                 limits: MultiModalLimits):
        self.image_token_id = config.image_token_id
        self.num_image_tokens = config.num_image_tokens
        self.image_config = image_config
        self.limits = limits
        size = image_config.output_size()
        want = (config.vision.image_size, config.vision.image_size)
        if size != want:
            raise ValueError(f"preprocessor_config.json gives {size[0]}x{size[1]} images, the "
                             f"vision tower takes {want[0]}x{want[1]}")

    @classmethod
    def from_dir(cls, path: str, limits: MultiModalLimits) -> Optional["ImagePromptProcessor"]:
        """The processor of a LLaVA checkpoint directory; None for a text-only checkpoint."""
        if not is_llava_checkpoint(path):
            return None
        return cls(read_llava_config(path), ImageProcessorConfig.from_dir(os.fspath(path)),
                   limits)

    def process(self, token_ids: Sequence[int], images: Sequence[object]) -> MultiModalPrompt:
        """Expands the placeholders of `token_ids` and preprocesses `images` (in order).

        Args:
            token_ids: the prompt, one placeholder token per image.
            images: PIL images or PNG/JPEG bytes.
        Returns:
            The MultiModalPrompt.
        Raises:
            ValueError: a placeholder count that is not len(images), too many images, or an
                image that cannot be used (ImageInputError).
        """
        self.limits.check_count(len(images))
        at = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        if len(at) != len(images):
            raise ValueError(f"the prompt has {len(at)} image placeholder token(s) (id "
                             f"{self.image_token_id}) but {len(images)} image(s) were given: "
                             f"put one placeholder where each image goes")
        decoded = [load_image(img, self.limits) for img in images]
        ids: List[int] = []
        kv: List[np.ndarray] = []
        items = []
        prev = 0
        n = self.num_image_tokens
        for pos, img in zip(at, decoded):
            ids.extend(token_ids[prev:pos])
            kv.append(np.asarray(token_ids[prev:pos], dtype=np.int32))
            digest = image_hash(img)
            items.append(ImageInput(digest, preprocess(img, self.image_config), len(ids), n))
            ids.extend([self.image_token_id] * n)
            kv.append(placeholder_cache_ids(digest, n))
            prev = pos + 1
        ids.extend(token_ids[prev:])
        kv.append(np.asarray(token_ids[prev:], dtype=np.int32))
        return MultiModalPrompt(ids, np.concatenate(kv).astype(np.int32), tuple(items))


def text_only_error(model_path: str) -> ValueError:
    """The error for images sent to a text-only model."""
    return ImageInputError(f"the model at {model_path} is text-only (not a LLaVA or Mllama checkpoint): "
                           f"it takes no images")
