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

from typing import Optional

import torch
from torch import nn

from pagedllm.model.attention import AttentionMetadata
from pagedllm.model.clip_vision import ClipVisionTower, activation
from pagedllm.model.kv_cache import PagedKVCache
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.model.llava_config import LlavaConfig


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
                mm_embeds: Optional[torch.Tensor] = None, observer=None) -> torch.Tensor:
        """One decoder step (LlamaForCausalLM.forward) with image embeddings at some rows.

        Args:
            input_ids: [num_tokens] int64 (image positions hold the image token id).
            positions, meta, kv: as for LlamaForCausalLM.forward.
            mm_rows: [k] int64, packed rows that take image embeddings (None: text only).
            mm_embeds: [k, hidden_size], those embeddings, in mm_rows' order.
            observer: the decoder's layer observer (LlamaForCausalLM.forward).
        Returns:
            hidden: [num_tokens, hidden_size], final norm applied.
        """
        lm = self.language_model
        x = lm.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        if mm_rows is not None and mm_rows.numel():
            x[mm_rows] = mm_embeds.to(x.dtype)
        return lm(input_ids, positions, meta, kv, inputs_embeds=x, observer=observer)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of rows of forward's output: [n, hidden_size] -> [n, vocab_size] float32."""
        return self.language_model.compute_logits(hidden)
