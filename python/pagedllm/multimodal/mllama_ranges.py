"""Which vision tokens each text token of an Mllama prompt cross-attends: [lo, hi) ranges.

transformers' MllamaProcessor (get_cross_attention_token_mask) lets the token at position t see
image i iff start_i <= t < end_i, where start_i is the position of the i-th `<|image|>` token
and end_i the next image's position (the prompt's end for the last); a run of consecutive
`<|image|>` tokens is one group: each of its images is seen up to the end of the group's last
image. Generated tokens see what the last prompt token sees (transformers repeats the mask's
last row while generating).

The cross K/V of a request hold, image after image, the vision tokens of each image's valid
tiles (tokens_per_image[i] = num_tiles_i * num_patches). The images a token sees are always
consecutive, so they are one contiguous range [lo, hi) of those cross tokens; a token that
sees no image gets [0, 0). Computed on the host once per request; the step's kv_ranges take
rows of it (plain data, like the rest of the step).
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np


def image_spans(ids: Sequence[int], image_token_id: int) -> List[List[int]]:
    """[start, end) of the positions that see each image, in image order."""
    locs = [i for i, t in enumerate(ids) if t == image_token_id]
    spans = [[a, b] for a, b in zip(locs, locs[1:] + [len(ids)])]
    end = len(ids)
    for span in reversed(spans):  # a run of consecutive images is seen to the run's end
        if span[1] == span[0] + 1:
            span[1] = end
        end = span[1]
    return spans


def cross_token_ranges(ids: Sequence[int], image_token_id: int,
                       tokens_per_image: Sequence[int]) -> np.ndarray:
    """The cross-token range every prompt position attends.

    Args:
        ids: the prompt's token ids (one `<|image|>` per image).
        image_token_id: the `<|image|>` id.
        tokens_per_image: cross tokens stored per image, in order.
    Returns:
        int32 [len(ids), 2]: (lo, hi) per position, (0, 0) where no image is seen.
    Raises:
        ValueError: the prompt's `<|image|>` count differs from len(tokens_per_image).
    """
    spans = image_spans(ids, image_token_id)
    if len(spans) != len(tokens_per_image):
        raise ValueError(f"the prompt has {len(spans)} <|image|> token(s) (id "
                         f"{image_token_id}) but {len(tokens_per_image)} image(s) were given: "
                         f"put one <|image|> where each image goes")
    starts = np.concatenate([[0], np.cumsum(tokens_per_image)]).astype(np.int64)
    n = len(ids)
    lo = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(n, dtype=np.int64)
    for k, (a, b) in enumerate(spans):
        lo[a:b] = np.minimum(lo[a:b], starts[k])
        hi[a:b] = np.maximum(hi[a:b], starts[k + 1])
    lo[hi == 0] = 0
    return np.stack([lo, hi], axis=1).astype(np.int32)


def ranges_at(prompt_ranges: np.ndarray, start: int, n: int) -> np.ndarray:
    """Rows [start, start + n) of a sequence's ranges: prompt rows, then the last prompt
    row repeated for generated positions. int32 [n, 2]."""
    p = prompt_ranges.shape[0]
    idx = np.minimum(np.arange(start, start + n), p - 1)
    return prompt_ranges[idx]
