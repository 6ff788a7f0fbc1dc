"""The engine's entry for images: `multi_modal_data` of a prompt -> Request fields.

One object per engine. For a LLaVA checkpoint it owns the ImagePromptProcessor
(placeholders, preprocessing, limits) and the scheduler's EncoderScheduler (encoder cache
bookkeeping and budget); for an Mllama checkpoint the MllamaPromptProcessor (`mllama`: images
reach the decoder through cross-attention, mllama_prompt.py) and an EncoderScheduler whose
budget counts vision tokens, inside the CrossScheduler the engine hands the scheduler; for a
text-only checkpoint all are None and a prompt with images is refused with a clear error.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from pagedllm.multimodal.cross_schedule import CrossScheduler
from pagedllm.multimodal.encoder_schedule import EncoderScheduler
from pagedllm.multimodal.hashing import salt_image_blocks
from pagedllm.multimodal.image_io import ImageInputError
from pagedllm.multimodal.limits import MultiModalLimits
from pagedllm.multimodal.mllama_prompt import MllamaPromptProcessor
from pagedllm.multimodal.prompt import ImagePromptProcessor, text_only_error

MODALITIES = ("image",)


def images_of(prompt: Any) -> List[object]:
    """The images of a prompt dict's `multi_modal_data` ({"image": one or a list}); [] if none.

    Raises:
        ValueError: multi_modal_data is not a mapping or names another modality.
    """
    if not isinstance(prompt, dict) or prompt.get("multi_modal_data") is None:
        return []
    data = prompt["multi_modal_data"]
    if not isinstance(data, dict):
        raise ImageInputError(f"multi_modal_data must be a dict like {{'image': image}}, got "
                              f"{type(data).__name__}")
    other = sorted(set(data) - set(MODALITIES))
    if other:
        raise ImageInputError(f"multi_modal_data has {other}: only {list(MODALITIES)} is "
                              f"supported")
    images = data.get("image", [])
    images = list(images) if isinstance(images, (list, tuple)) else [images]
    for i, img in enumerate(images):
        if img is None:
            where = "multi_modal_data['image']" + (f"[{i}]" if len(images) > 1 else "")
            raise ImageInputError(f"{where} is None: expected a PIL image or the bytes of a "
                                  f"PNG/JPEG file (leave out multi_modal_data for a text-only "
                                  f"prompt)")
    return images


class EngineImages:
    """Image handling for one engine.

    Args:
        model_path: the checkpoint directory.
        limits: per-prompt limits.
        max_num_encoder_tokens: the encoder budget per step (None: max(max_num_batched_tokens,
            one image's embeddings)).
        max_num_batched_tokens: the scheduler's token budget.
        block_size: the KV block size (image blocks' cache ids are salted per block).
        encoder_cache_images: unused encoder outputs kept for reuse.
        num_cross_blocks: blocks of the worker's cross-attention pool (Mllama; 0: none).
        share_cross_blocks: content-key the cross pool (enable_prefix_caching).
    Raises:
        ValueError: an encoder budget below one image's embeddings, or a bad preprocessor
            config.
    """

    def __init__(self, model_path: str, limits: MultiModalLimits,
                 max_num_encoder_tokens: Optional[int], max_num_batched_tokens: int,
                 block_size: int, encoder_cache_images: int = 0, num_cross_blocks: int = 0,
                 share_cross_blocks: bool = True):
        self.model_path = model_path
        self.block_size = block_size
        self.processor = ImagePromptProcessor.from_dir(model_path, limits)
        self.mllama = (MllamaPromptProcessor.from_dir(model_path, limits, block_size)
                       if self.processor is None else None)
        self.encoder: Optional[EncoderScheduler] = None
        self.cross: Optional[CrossScheduler] = None  # the scheduler's, for Mllama
        if self.mllama is not None:  # every image of a request is encoded at its admission
            self.cross = CrossScheduler(num_cross_blocks, block_size, EncoderScheduler(
                max_num_encoder_tokens or max(max_num_batched_tokens,
                                              self.mllama.max_cross_tokens),
                encoder_cache_images), share_cross_blocks)
        if self.processor is None:
            return
        per_image = self.processor.num_image_tokens
        budget = max_num_encoder_tokens or max(max_num_batched_tokens, per_image)
        if budget < per_image:
            raise ValueError(f"max_num_encoder_tokens = {budget} is below one image's "
                             f"{per_image} embeddings: no image could ever be encoded")
        self.encoder = EncoderScheduler(budget, encoder_cache_images)

    def prepare(self, token_ids: List[int], images: List[object]) -> Tuple[List[int], dict]:
        """Expanded prompt ids and the Request keyword arguments for its images.

        Raises:
            ValueError: images for a text-only model, a placeholder count that differs from
                the image count, a limit exceeded, unusable image data.
        """
        if self.mllama is not None:
            if not images and self.mllama.image_token_id not in token_ids:
                return token_ids, {}
            mm = self.mllama.process(token_ids, images)
            self.cross.check_request(mm.cross_images)
            return token_ids, {"cross_images": mm.cross_images, "kv_prompt_ids": mm.kv_prompt_ids,
                               "cross_ranges": mm.cross_ranges}
        if self.processor is None:
            if images:
                raise text_only_error(self.model_path)
            return token_ids, {}
        if not images and self.processor.image_token_id not in token_ids:
            return token_ids, {}
        mm = self.processor.process(token_ids, images)
        kv = salt_image_blocks(mm.kv_token_ids, mm.images, self.block_size)
        return mm.token_ids, {"images": mm.images, "kv_prompt_ids": kv}
