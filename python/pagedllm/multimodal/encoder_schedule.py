"""The scheduler's side of the encoder: what the worker's encoder cache holds, the per-step
encoder budget, and which rows of a step take which image embeddings.

The worker keeps each image's encoder output by content hash (encoder_cache.py) while some live
request has that image, so the encoder runs once per image per request (and once for all
concurrent requests that share it), also across preemptions; after the last such request the
output stays, least recently released first out, while at most `keep_unused_images` unused
outputs are kept, so a repeated image skips the encoder too (a prefix-cache hit still
recomputes the prompt's last block, which often holds the image's tail). Each step may encode at most
`max_num_encoder_tokens` image tokens (vLLM's encoder budget): a prompt chunk that would reach
an image whose encoding does not fit stops just before the image, and continues in a later
step. So an image-heavy request spreads its encoder work over steps and the decodes batched
with it still run every step. An image may be split across prefill chunks: the decoder's
attention is causal and a later chunk reads the rest of the cached encoder output.

This object is one of the scheduler's helpers; it reads Requests and writes only its own state.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np


@dataclass
class StepMultiModal:
    """The image work of one step, for the worker.

    Attributes:
        free: hashes whose encoder outputs the worker may drop (before encoding).
        encode: (hash, float32 pixel values [3, H, W]) of the images to encode this step.
        rows: (hash, first feature row, end feature row, first packed token row): the packed
            rows [row, row + end - first) take rows [first, end) of that image's embeddings.
    """

    free: List[bytes] = field(default_factory=list)
    encode: List[Tuple[bytes, np.ndarray]] = field(default_factory=list)
    rows: List[Tuple[bytes, int, int, int]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.free or self.encode or self.rows)


class EncoderScheduler:
    """Tracks encoder outputs by content hash and spends the per-step encoder budget.

    Args:
        max_num_encoder_tokens: most image tokens (embeddings) encoded in one step; must be at
            least the embeddings of one image (the engine checks it).
        keep_unused_images: encoder outputs no live request needs that are kept for reuse.
    """

    def __init__(self, max_num_encoder_tokens: int, keep_unused_images: int = 0):
        if max_num_encoder_tokens < 1:
            raise ValueError(f"max_num_encoder_tokens = {max_num_encoder_tokens}: expected >= 1")
        if keep_unused_images < 0:
            raise ValueError(f"encoder_cache_images = {keep_unused_images}: expected >= 0")
        self.max_num_encoder_tokens = max_num_encoder_tokens
        self.keep_unused_images = keep_unused_images
        self._unused: "OrderedDict[bytes, None]" = OrderedDict()  # cached, no live request
        self._refs: Dict[bytes, int] = {}   # hash -> live requests that have the image
        self._cached: Set[bytes] = set()    # hashes the worker holds (after the last step)
        self._reserved: Set[bytes] = set()  # encodes planned in the step being scheduled
        self._left = max_num_encoder_tokens
        self._free: List[bytes] = []
        self.num_encoded_images = 0
        self.num_encoded_tokens = 0

    # --- request lifetime ---------------------------------------------------------------------
    def add_request(self, images: Sequence) -> None:
        """A request with these ImageInputs joined the engine."""
        for h in {im.content_hash for im in images}:
            self._refs[h] = self._refs.get(h, 0) + 1
            self._unused.pop(h, None)  # needed again: no longer evictable

    def release_request(self, images: Sequence) -> None:
        """A request with these ImageInputs finished; outputs no request needs join the unused
        LRU, and those past keep_unused_images are freed next step."""
        for h in {im.content_hash for im in images}:
            n = self._refs.get(h, 0) - 1
            if n > 0:
                self._refs[h] = n
                continue
            self._refs.pop(h, None)
            if h in self._cached:
                self._unused[h] = None
        while len(self._unused) > self.keep_unused_images:
            h, _ = self._unused.popitem(last=False)
            self._cached.discard(h)
            self._free.append(h)

    @property
    def num_cached(self) -> int:
        """Images whose encoder output the worker holds."""
        return len(self._cached)

    # --- one step -----------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Resets the step's encoder budget."""
        self._reserved = set()
        self._left = self.max_num_encoder_tokens

    def fit(self, images: Sequence, start: int, n: int) -> int:
        """The ask: how many of the `n` prompt positions from `start` can be computed this step.

        Every image overlapping them needs its encoder output: cached, planned this step, or
        encodable within the step's remaining budget. The chunk stops before the first image
        that does not fit (0: nothing can run this step). No side effects.
        """
        left = self._left
        for im in images:
            if im.end <= start or im.offset >= start + n:
                continue
            h = im.content_hash
            if h in self._cached or h in self._reserved:
                continue
            if im.length > left:
                return max(0, im.offset - start)
            left -= im.length
        return n

    def reserve(self, images: Sequence, start: int, n: int) -> None:
        """The do: spends the budget for the images positions [start, start + n) need (after
        fit() allowed them and the chunk was scheduled)."""
        for im in images:
            h = im.content_hash
            if (im.end <= start or im.offset >= start + n or h in self._cached
                    or h in self._reserved):
                continue
            self._reserved.add(h)
            self._left -= im.length

    def step_inputs(self, spans: Sequence[Tuple[Sequence, int, int, int]]) -> Optional[StepMultiModal]:
        """The worker's image work for the scheduled spans, marking new encodes as cached.

        Args:
            spans: (images, start position, new tokens, first packed row) per scheduled entry.
        Returns:
            The StepMultiModal, or None when the step has no image work.
        """
        out = StepMultiModal(free=self._free)
        self._free = []
        planned: Set[bytes] = set()
        for images, start, n, row0 in spans:
            for im in images:
                a, b = max(start, im.offset), min(start + n, im.end)
                if a >= b:
                    continue
                h = im.content_hash
                if h not in self._cached and h not in planned:
                    planned.add(h)
                    out.encode.append((h, im.pixel_values))
                    self.num_encoded_images += 1
                    self.num_encoded_tokens += im.length
                out.rows.append((h, a - im.offset, b - im.offset, row0 + a - start))
        for h in planned:  # an encode for no live request is dropped again next step
            (self._cached.add(h) if h in self._refs else self._free.append(h))
        return None if out.is_empty else out
