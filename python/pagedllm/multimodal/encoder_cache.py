"""The worker's encoder cache: image embeddings by content hash, and one step's image rows.

Device side (it holds model outputs on the model's device). The scheduler decides what is
encoded, kept and dropped (encoder_schedule.py); this object only executes a StepMultiModal:
drop the freed outputs, encode the new images in one batch, then gather the embeddings of the
step's image rows for the model's forward.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from pagedllm.multimodal.encoder_schedule import StepMultiModal


class EncoderCache:
    """Encoder outputs ([num_image_tokens, hidden] each) of the images live requests have.

    Args:
        model: a model with `encode_images(pixels [k, 3, H, W]) -> [k, n, hidden]`.
        device: where the pixels go and the outputs live.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self._out: Dict[bytes, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._out)

    @torch.inference_mode()
    def model_inputs(self, mm: StepMultiModal) -> dict:
        """Runs the step's encoder work and returns the forward's extra arguments.

        Returns:
            {"mm_rows": int64 [k], "mm_embeds": [k, hidden]} ({} when no row takes an image).
        Raises:
            ValueError: the model takes no images.
            RuntimeError: a row names an image that was never encoded (a scheduler bug).
        """
        for h in mm.free:
            self._out.pop(h, None)
        if mm.encode:
            if not hasattr(self.model, "encode_images"):
                raise ValueError("this model is text-only: it takes no images")
            # pixels: [k, 3, H, W] -> feats: [k, num_image_tokens, hidden]
            pixels = torch.from_numpy(np.stack([p for _, p in mm.encode])).to(self.device)
            feats = self.model.encode_images(pixels)
            for (h, _), f in zip(mm.encode, feats):
                self._out[h] = f
        if not mm.rows:
            return {}
        missing = [h.hex() for h, *_ in mm.rows if h not in self._out]
        if missing:
            raise RuntimeError(f"no encoder output for image {missing[0]}")
        embeds = torch.cat([self._out[h][a:b] for h, a, b, _ in mm.rows])  # [k, hidden]
        rows = np.concatenate([np.arange(r, r + b - a) for _, a, b, r in mm.rows])
        return {"mm_rows": torch.from_numpy(rows).to(self.device), "mm_embeds": embeds}
