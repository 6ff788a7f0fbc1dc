"""Float64 reference for paged_cross_attention, and the key ranges the tests draw.

The reference never uses the kernels: K/V are the exact stored values kernel_reference.make_paged_kv
returns per sequence, and attention is a float64 softmax over each query token's key range
[lo, hi) (non-causal); a token with an empty range gets a zero row.
"""

from __future__ import annotations

import random

import torch


def cross_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        ranges: torch.Tensor) -> torch.Tensor:
    """Float64 cross-attention of the query tokens of one sequence.

    Args:
        q: [Q, H, D] query tokens; k, v: [L, KVH, D] the sequence's cross keys/values.
        scale: softmax scale.
        ranges: [Q, 2] int (lo, hi): token i attends keys lo <= j < hi.
    Returns:
        [Q, H, D] float64; rows whose range is empty are zero. Query head h uses KV head
        h // (H // KVH).
    """
    q = q.to(torch.float64)
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [L, H, D]
    v = v.repeat_interleave(group, dim=1)
    for i, (lo, hi) in enumerate(ranges.tolist()):
        if lo >= hi:
            continue
        scores = torch.einsum("hd,khd->hk", q[i], k[lo:hi]) * scale  # [H, hi - lo]
        out[i] = torch.einsum("hk,khd->hd", torch.softmax(scores, dim=-1), v[lo:hi])
    return out


def random_ranges(rng: random.Random, q_len: int, length: int) -> list[tuple[int, int]]:
    """Key ranges for q_len query tokens over `length` cross tokens, Mllama-like: runs of
    consecutive tokens share a range (empty, the whole context, a prefix, an inner slice, a
    suffix), with an occasional one-token run."""
    out: list[tuple[int, int]] = []
    while len(out) < q_len:
        run = 1 if rng.random() < 0.2 else rng.randint(1, max(1, q_len))
        kind = rng.randrange(5)
        if kind == 0 or length == 0:
            lo = hi = rng.randint(0, length)
        elif kind == 1:
            lo, hi = 0, length
        elif kind == 2:
            lo, hi = 0, rng.randint(1, length)
        else:
            lo = rng.randint(0, length - 1)
            hi = length if kind == 4 else rng.randint(lo + 1, length)
        out.extend([(lo, hi)] * min(run, q_len - len(out)))
    return out
