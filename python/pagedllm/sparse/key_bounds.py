"""Quest's per-block key bounds: for each block, layer and KV head, the element-wise min and
max of the keys written so far, kept inside the block's own region of the pool
(PagedKVCache(key_bounds=True)), so copy-on-write copies, swaps and the persistent tier move
them with the block. Bounds are min/max of stored elements, hence exact in the storage dtype
(fp8 included).

After each layer's reshape_and_cache, the blocks written this step are recomputed from their
filled rows (rows 0 .. the last offset written), so a reused or copied block never keeps
stale bounds.
"""

from __future__ import annotations

import torch

from pagedllm.sparse.fp8 import as_float, from_float


def update_key_bounds(key_cache: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                      slot_mapping: torch.Tensor, kv_dtype: str) -> None:
    """Recomputes the bounds of the blocks that slot_mapping wrote.

    Args:
        key_cache: [num_blocks, num_kv_heads, block_size, head_dim] of one layer.
        kmin, kmax: [num_blocks, num_kv_heads, head_dim] views of its bounds (storage dtype).
        slot_mapping: [num_tokens] slots written this step (-1: skipped).
        kv_dtype: the kernels' cache dtype name ("auto", "fp8_e4m3", "fp8_e5m2").
    """
    block_size = key_cache.shape[2]
    slots = slot_mapping[slot_mapping >= 0].to(torch.int64)
    if slots.numel() == 0:
        return
    blocks = slots // block_size
    touched, inverse = torch.unique(blocks, return_inverse=True)
    # fill[i]: rows of block touched[i] written so far (tokens are appended in order)
    fill = torch.zeros(touched.shape[0], dtype=torch.int64, device=slots.device)
    fill.scatter_reduce_(0, inverse, slots % block_size + 1, reduce="amax")
    # index_select, not key_cache[touched]: advanced indexing of a strided pool view is slow
    keys = as_float(key_cache.index_select(0, touched), kv_dtype)  # [n, kvh, bs, hd] float32
    rows = torch.arange(block_size, device=slots.device)
    empty = (rows[None, :] >= fill[:, None])[:, None, :, None]  # [n, 1, block_size, 1]
    lo = keys.masked_fill(empty, float("inf")).amin(dim=2)   # [n, kvh, head_dim]
    hi = keys.masked_fill(empty, float("-inf")).amax(dim=2)
    kmin.index_copy_(0, touched, from_float(lo, kmin.dtype, kv_dtype))
    kmax.index_copy_(0, touched, from_float(hi, kmax.dtype, kv_dtype))
