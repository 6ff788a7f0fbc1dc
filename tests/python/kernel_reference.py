"""Float64 torch references for the CPU paged-attention kernels, and helpers to build caches.

The references never use the kernels: caches are written with torch indexing, read back by
gathering each sequence's blocks into contiguous K/V, and attention is computed in float64 with
an explicit causal mask. fp8 caches are uint8 tensors whose bytes are torch's float8 encodings.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

FP8_TORCH = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
             "fp8_e5m2": torch.float8_e5m2}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# Relative rounding error bound (half an ulp) of each storage type.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
                 "fp8_e4m3": 2.0 ** -4, "fp8_e5m2": 2.0 ** -3}


def storage_torch_dtype(kv_cache_dtype: str, act_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of a cache tensor for kv_cache_dtype ('auto' = the activations')."""
    if kv_cache_dtype in FP8_TORCH:
        return torch.uint8
    return {"auto": act_dtype, "fp16": torch.float16, "bf16": torch.bfloat16,
            "fp32": torch.float32}[kv_cache_dtype]


def quantize(x: torch.Tensor, kv_cache_dtype: str, act_dtype: torch.dtype,
             scale: float) -> torch.Tensor:
    """What a cache stores for values x (any float dtype): float types by torch's round to
    nearest even; fp8 as uint8 bytes of (x / scale) saturated to the format's max."""
    if kv_cache_dtype in FP8_TORCH:
        f8 = FP8_TORCH[kv_cache_dtype]
        y = x.float() / torch.tensor(scale, dtype=torch.float32)
        m = FP8_MAX[f8]
        return y.clamp(-m, m).to(f8).view(torch.uint8)
    return x.to(storage_torch_dtype(kv_cache_dtype, act_dtype))


def dequantize(stored: torch.Tensor, kv_cache_dtype: str, scale: float) -> torch.Tensor:
    """Exact float64 values of stored cache elements (fp8: bytes decoded, times scale)."""
    if kv_cache_dtype in FP8_TORCH:
        return stored.view(FP8_TORCH[kv_cache_dtype]).to(torch.float64) * scale
    return stored.to(torch.float64)


@dataclass
class PagedKV:
    """One layer's paged caches plus the block tables that scatter each sequence over them."""
    key_cache: torch.Tensor     # [num_blocks, kvh, block_size, head_dim] (maybe a pool view)
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32; unused entries hold -7
    context_lens: torch.Tensor  # [num_seqs] int32
    k_full: list[torch.Tensor]  # per sequence: [len, kvh, head_dim] float64 stored values
    v_full: list[torch.Tensor]


def make_paged_kv(gen: torch.Generator, lens: list[int], kvh: int, head_dim: int,
                  block_size: int, kv_cache_dtype: str, act_dtype: torch.dtype,
                  k_scale: float = 1.0, v_scale: float = 1.0, spare_blocks: int = 3,
                  pool_layers: int = 0, poison: bool = True) -> PagedKV:
    """Random K/V for sequences of the given context lengths, written into randomly permuted
    blocks of fresh caches with torch indexing. pool_layers > 0 makes the caches per-layer views
    pool[:, l, 0] / pool[:, l, 1] of a block-major pool (non-contiguous block dim)."""
    blocks_per_seq = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    cache_dtype = storage_torch_dtype(kv_cache_dtype, act_dtype)
    shape = (num_blocks, kvh, block_size, head_dim)
    if pool_layers > 0:
        pool = torch.empty((num_blocks, pool_layers, 2, kvh, block_size, head_dim),
                           dtype=cache_dtype)
        layer = pool_layers - 1
        key_cache, value_cache = pool[:, layer, 0], pool[:, layer, 1]
    else:
        key_cache = torch.empty(shape, dtype=cache_dtype)
        value_cache = torch.empty(shape, dtype=cache_dtype)
    if poison:  # unwritten cache slots hold NaN (or the fp8 NaN byte): reading them would show
        if cache_dtype == torch.uint8:
            key_cache.fill_(0x7F)
            value_cache.fill_(0x7F)
        else:
            key_cache.fill_(float("nan"))
            value_cache.fill_(float("nan"))
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(blocks_per_seq + [1])
    tables = torch.full((len(lens), max_blocks + 1), -7, dtype=torch.int32)
    k_full, v_full = [], []
    for s, n in enumerate(lens):
        ids = [perm.pop() for _ in range(blocks_per_seq[s])]
        tables[s, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        k = torch.randn((n, kvh, head_dim), generator=gen).to(act_dtype)
        v = torch.randn((n, kvh, head_dim), generator=gen).to(act_dtype)
        k_st = quantize(k, kv_cache_dtype, act_dtype, k_scale)
        v_st = quantize(v, kv_cache_dtype, act_dtype, v_scale)
        pos = torch.arange(n)
        b = torch.tensor(ids, dtype=torch.long)[pos // block_size] if n else pos
        o = pos % block_size
        key_cache[b, :, o] = k_st  # advanced indices first: [n, kvh, head_dim]
        value_cache[b, :, o] = v_st
        k_full.append(dequantize(k_st, kv_cache_dtype, k_scale))
        v_full.append(dequantize(v_st, kv_cache_dtype, v_scale))
    return PagedKV(key_cache, value_cache, tables, torch.tensor(lens, dtype=torch.int32),
                   k_full, v_full)


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  positions: torch.Tensor) -> torch.Tensor:
    """Float64 causal attention of one sequence.

    q: [Q, H, D]; k, v: [L, KVH, D]; positions: [Q] position of each query token; it attends
    keys 0..position. Query head h uses KV head h // (H // KVH). Returns [Q, H, D] float64.
    """
    q = q.to(torch.float64)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [L, H, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [H, Q, L]
    keys = torch.arange(k.shape[0])
    mask = keys[None, :] > positions[:, None]  # [Q, L]
    scores = scores.masked_fill(mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def random_lens(rng: random.Random, block_size: int, count: int) -> list[int]:
    """Context lengths mixing 1, exact block multiples, one past them and random values."""
    picks = []
    for _ in range(count):
        kind = rng.randrange(4)
        if kind == 0:
            picks.append(1)
        elif kind == 1:
            picks.append(block_size * rng.randint(1, max(1, 600 // block_size)))
        elif kind == 2:
            picks.append(block_size * rng.randint(0, max(0, 600 // block_size)) + 1)
        else:
            picks.append(rng.randint(1, 700))
    return picks
