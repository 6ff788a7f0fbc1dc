"""The worker's side of Mllama's cross-attention K/V: encoder outputs by content hash, the
writes into the cross pool, and the step's CrossAttentionMetadata.

Device side. The scheduler decides what is encoded, kept, dropped and written
(cross_schedule.py); this object only executes a StepCross: drop the freed outputs, encode the
new images in one batch (vision model + projector: [valid tiles * num_patches, hidden] each),
write each admitted sequence's K/V (every cross-attention layer) into its cross slots, then
hand the forward the step's cross block tables and per-token ranges.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import torch

from pagedllm.model.cross_attention import CrossAttentionMetadata
from pagedllm.model.kv_cache import PagedKVCache
from pagedllm.multimodal.cross_schedule import StepCross


class CrossKVWriter:
    """Executes the cross-attention work of steps for one Mllama model.

    Args:
        model: an MllamaForConditionalGeneration (encode_images, write_cross_kv).
        cross_kv: the cross pool.
        device: where the pixels go and the outputs live.
    """

    def __init__(self, model: torch.nn.Module, cross_kv: PagedKVCache, device: torch.device):
        self.model = model
        self.cross_kv = cross_kv
        self.device = device
        self._out: Dict[bytes, torch.Tensor] = {}  # hash -> [num_cross_tokens, hidden]

    def __len__(self) -> int:
        return len(self._out)

    @torch.inference_mode()
    def step(self, sc: StepCross, cu_seqlens_q: torch.Tensor,
             upload: Callable[[str, np.ndarray], torch.Tensor]) -> CrossAttentionMetadata:
        """Runs the step's encodes and writes; returns the forward's cross metadata.

        Args:
            sc: the scheduler's StepCross.
            cu_seqlens_q: [num_seqs + 1] int32 on the device (the step's AttentionMetadata's).
            upload: (name, array) -> device tensor (the runner's staging).
        Raises:
            RuntimeError: a write names an image that was never encoded (a scheduler bug).
        """
        for h in sc.free:
            self._out.pop(h, None)
        if sc.encode:
            ims = [im for _, im in sc.encode]
            dev = self.device
            # pixels: [k, max_tiles, 3, H, W]; ids: [k]; mask: [k, max_tiles]
            pixels = torch.from_numpy(np.stack([im.pixel_values for im in ims])).to(dev)
            ids = torch.tensor([im.aspect_ratio_id for im in ims], dtype=torch.int64, device=dev)
            mask = torch.from_numpy(np.stack([im.aspect_ratio_mask for im in ims])).to(dev)
            states = self.model.encode_images(pixels, ids, mask, [im.num_tiles for im in ims])
            for (h, _), s in zip(sc.encode, states):
                self._out[h] = s
        for hashes, skip, slots in sc.writes:
            missing = [h.hex() for h in hashes if h not in self._out]
            if missing:
                raise RuntimeError(f"no encoder output for image {missing[0]}")
            # states: [len(slots), hidden], the images' tokens past those already in the pool
            states = torch.cat([self._out[h] for h in hashes])[skip:]
            self.model.write_cross_kv(states, torch.from_numpy(slots).to(self.device),
                                      self.cross_kv)
        return CrossAttentionMetadata(
            kv=self.cross_kv,
            block_tables=upload("cross_tables", sc.block_tables),   # [num_seqs, W] int32
            context_lens=upload("cross_ctx", sc.context_lens),      # [num_seqs] int32
            cu_seqlens_q=cu_seqlens_q,                              # [num_seqs + 1] int32
            kv_ranges=upload("cross_ranges", sc.kv_ranges))         # [num_tokens, 2] int32
