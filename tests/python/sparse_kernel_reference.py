"""Float64 reference of block-sparse paged attention, and helpers to build CSR block lists.

The reference masks, per KV head, every key whose logical block is not in that head's list and
then runs the dense float64 causal attention (kernel_reference.attention_ref's arithmetic). A
query row that sees no key at all has an output of zeros (the kernels' convention for an empty
context).
"""

from __future__ import annotations

import random

import torch


def sparse_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                         positions: torch.Tensor, blocks: list[list[int]],
                         block_size: int) -> torch.Tensor:
    """Float64 causal attention of one sequence over the listed blocks only.

    Args:
        q: [Q, H, D]; k, v: [L, KVH, D] stored (dequantized) values.
        positions: [Q] position of each query token (it attends keys <= its position).
        blocks: per KV head, the logical block ids it attends to.
        block_size: tokens per block.
    Returns:
        [Q, H, D] float64.
    """
    q = q.to(torch.float64)
    kvh = k.shape[1]
    group = q.shape[1] // kvh
    keys = torch.arange(k.shape[0])
    causal = keys[None, :] > positions[:, None]  # [Q, L] True = masked
    out = torch.zeros(q.shape, dtype=torch.float64)
    for h in range(kvh):
        keep = torch.zeros(k.shape[0], dtype=torch.bool)
        for b in blocks[h]:
            keep[b * block_size:(b + 1) * block_size] = True
        mask = causal | ~keep[None, :]  # [Q, L]
        qh = q[:, h * group:(h + 1) * group]  # [Q, G, D]
        scores = torch.einsum("qgd,kd->gqk", qh, k[:, h]) * scale  # [G, Q, L]
        scores = scores.masked_fill(mask[None], float("-inf"))
        seen = ~mask.all(dim=1)  # [Q]
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        o = torch.einsum("gqk,kd->qgd", probs, v[:, h])
        out[:, h * group:(h + 1) * group] = o * seen[:, None, None]
    return out


def to_csr(lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR (indptr [len(lists) + 1], indices) int32 tensors of sorted block lists."""
    indptr = [0]
    indices: list[int] = []
    for ids in lists:
        indices.extend(ids)
        indptr.append(len(indices))
    return (torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32))


def random_lists(rng: random.Random, lens: list[int], kvh: int, block_size: int,
                 per_head: bool, keep_last: bool = True) -> list[list[list[int]]]:
    """Per sequence, per KV head: a random sorted subset of its blocks (the last one kept when
    keep_last; with per_head False every head gets the same list)."""
    out = []
    for n in lens:
        used = (n + block_size - 1) // block_size
        heads = []
        for h in range(kvh):
            if h and not per_head:
                heads.append(heads[0])
                continue
            ids = [b for b in range(used) if rng.random() < rng.choice([0.2, 0.5, 0.9])]
            if keep_last and used and used - 1 not in ids:
                ids.append(used - 1)
            heads.append(sorted(ids))
        out.append(heads)
    return out


def flatten_lists(lists: list[list[list[int]]], per_head: bool) -> list[list[int]]:
    """The CSR lists in kernel order: per sequence, or per (sequence, KV head)."""
    if per_head:
        return [heads[h] for heads in lists for h in range(len(heads))]
    return [heads[0] for heads in lists]
