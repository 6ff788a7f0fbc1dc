"""An Mllama prompt with images -> its images' inputs, cache ids and cross-attention ranges.

The prompt holds one `<|image|>` token (config.json's `image_token_index`) per image, in order,
and is NOT expanded: the images reach the decoder through cross-attention, not through prompt
positions. Each image is decoded and preprocessed (mllama_processor.py: tiles, aspect ratio);
it gives num_tiles * num_patches vision tokens, whose K/V live in the request's cross blocks.
For the prefix cache the `<|image|>` position holds an id derived from the image's content hash
(hashing.py, as LLaVA's image positions), and the text ids before it in its block are salted,
so every block from the image on is keyed by the image. A `<|image|>` count that differs from
the image count, too many images or unusable image data is a ValueError saying which.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from pagedllm.model.mllama_config import (MllamaConfig, is_mllama_checkpoint,
                                          read_mllama_config)
from pagedllm.multimodal.hashing import placeholder_cache_ids, salt_image_blocks
from pagedllm.multimodal.limits import MultiModalLimits
from pagedllm.multimodal.mllama_processor import MllamaImageProcessorConfig, process_images
from pagedllm.multimodal.mllama_ranges import cross_token_ranges


@dataclass(frozen=True)
class MllamaImageInput:
    """One image of an Mllama prompt.

    Attributes:
        content_hash: BLAKE2b-128 of the decoded pixels (the encoder cache's key).
        pixel_values: float32 [max_tiles, 3, tile, tile], tiles >= num_tiles zero.
        aspect_ratio_id: the vision model's aspect-ratio id (1-based).
        aspect_ratio_mask: int64 [max_tiles], 1 for the valid tiles.
        num_tiles: valid tiles.
        offset: prompt position of its `<|image|>` token.
        num_cross_tokens: its vision tokens in the cross blocks (num_tiles * num_patches).
    """

    content_hash: bytes
    pixel_values: np.ndarray
    aspect_ratio_id: int
    aspect_ratio_mask: np.ndarray
    num_tiles: int
    offset: int
    num_cross_tokens: int


@dataclass(frozen=True)
class MllamaPrompt:
    """What a request needs of its images (Request keyword arguments)."""

    cross_images: tuple          # MllamaImageInput, in order
    kv_prompt_ids: np.ndarray    # int32 [len(prompt)], image positions' content-derived ids
    cross_ranges: np.ndarray     # int32 [len(prompt), 2]


class MllamaPromptProcessor:
    """Preprocesses the images of prompts for one Mllama checkpoint.

    Args:
        config: the checkpoint's MllamaConfig.
        image_config: its preprocessing (preprocessor_config.json).
        limits: per-prompt image limits.
        block_size: the KV block size (image blocks' cache ids are salted per block).
    Raises:
        ValueError: a preprocessing config that does not fit the vision model.
    """

    def __init__(self, config: MllamaConfig, image_config: MllamaImageProcessorConfig,
                 limits: MultiModalLimits, block_size: int):
        self.image_token_id = config.image_token_id
        self.num_patches = config.num_patches
        self.max_num_tiles = config.max_num_tiles
        self.image_config = image_config
        self.limits = limits
        self.block_size = block_size
        v = config.vision
        image_config.check_vision(v.image_size, v.max_num_tiles, v.max_aspect_ratio_id)

    @classmethod
    def from_dir(cls, path: str, limits: MultiModalLimits,
                 block_size: int) -> Optional["MllamaPromptProcessor"]:
        """The processor of an Mllama checkpoint directory; None for any other checkpoint."""
        if not is_mllama_checkpoint(path):
            return None
        return cls(read_mllama_config(path), MllamaImageProcessorConfig.from_dir(os.fspath(path)),
                   limits, block_size)

    @property
    def max_cross_tokens(self) -> int:
        """Vision tokens of the largest prompt the limits allow (max images, all tiles)."""
        return self.limits.max_images_per_prompt * self.max_num_tiles * self.num_patches

    def process(self, token_ids: Sequence[int], images: Sequence[object]) -> MllamaPrompt:
        """Checks and preprocesses the images of one prompt.

        Args:
            token_ids: the prompt, one `<|image|>` per image.
            images: PIL images or PNG/JPEG bytes, in order.
        Returns:
            The MllamaPrompt.
        Raises:
            ValueError: an `<|image|>` count that is not len(images), too many images, or an
                image that cannot be used (ImageInputError).
        """
        self.limits.check_count(len(images))
        at = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        if len(at) != len(images):
            raise ValueError(f"the prompt has {len(at)} <|image|> token(s) (id "
                             f"{self.image_token_id}) but {len(images)} image(s) were given: "
                             f"put one <|image|> where each image goes")
        done = process_images(images, self.image_config, self.limits)
        items: List[MllamaImageInput] = []
        kv = np.asarray(token_ids, dtype=np.int32).copy()
        for pos, im in zip(at, done):
            items.append(MllamaImageInput(im.content_hash, im.pixel_values, im.aspect_ratio_id,
                                          im.aspect_ratio_mask, im.num_tiles, pos,
                                          im.num_tiles * self.num_patches))
            kv[pos] = placeholder_cache_ids(im.content_hash, 1)[0]
        kv = salt_image_blocks(kv, items, self.block_size)
        ranges = cross_token_ranges(token_ids, self.image_token_id,
                                    [im.num_cross_tokens for im in items])
        return MllamaPrompt(tuple(items), kv, ranges)
