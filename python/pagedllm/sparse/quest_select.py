"""Quest's per-step choice: for each decode sequence with a budget and each KV head, the blocks
with the largest upper bound of q.k, computed from the block's key bounds (Quest, ICML 2024):

    ub(block) = sum_d max(q_d * min_d, q_d * max_d) = q+ . max + q- . min

maximised over the query heads of the GQA group, the always-read blocks forced in. On the CPU
the C++ kernel `_core.quest_select` does it on the kernel thread pool; on a GPU it is torch on
the pool's device (no host sync). Every list's length is known on the host (its budget, or its
static list's length), so indptr is built there.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedllm import _core
from pagedllm.sparse.fp8 import as_float
from pagedllm.sparse.plan import SparsePlan


def quest_lists(query: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                block_tables: torch.Tensor, plan: SparsePlan,
                kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (decode sequence, KV head) block lists in CSR form.

    Args:
        query: [num_decode_seqs, num_heads, head_dim] (RoPE'd).
        kmin, kmax: [num_blocks, num_kv_heads, head_dim] key bounds of this layer.
        block_tables: [num_decode_seqs, W] int32 physical blocks.
        plan: the step's plan (budget > 0 marks the query-aware sequences).
        kv_dtype: the kernels' cache dtype name.
    Returns:
        indptr [num_decode_seqs * num_kv_heads + 1] int32 (host) and indices int32 on the
        query's device; list s * num_kv_heads + h is KV head h of sequence s.
    """
    nd, heads, hd = query.shape
    kvh = kmin.shape[1]
    lengths = np.where(plan.budget > 0, plan.budget, np.diff(plan.indptr)).repeat(kvh)
    indptr = np.zeros(nd * kvh + 1, dtype=np.int32)
    np.cumsum(lengths, out=indptr[1:])
    if query.device.type == "cpu":
        out = torch.empty(int(indptr[-1]), dtype=torch.int32)
        _core.quest_select(query, kmin, kmax, block_tables, plan.num_blocks, plan.budget,
                           plan.indptr, plan.indices, indptr, out, kv_dtype)
        return torch.from_numpy(indptr), out
    return torch.from_numpy(indptr), _torch_indices(query, kmin, kmax, block_tables, plan,
                                                    kv_dtype)


def _torch_indices(query: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                   block_tables: torch.Tensor, plan: SparsePlan, kv_dtype: str) -> torch.Tensor:
    """quest_lists' indices with torch ops on the query's device (the GPU path)."""
    nd, heads, hd = query.shape
    kvh = kmin.shape[1]
    dev = query.device
    quest = np.flatnonzero(plan.budget > 0)
    top = None
    if len(quest):
        width = int(plan.num_blocks[quest].max())
        rows = torch.as_tensor(quest, device=dev)
        phys = block_tables[rows, :width].long().reshape(-1)          # [nq * width]
        lo = as_float(kmin.index_select(0, phys), kv_dtype).view(len(quest), width, kvh, hd)
        hi = as_float(kmax.index_select(0, phys), kv_dtype).view(len(quest), width, kvh, hd)
        q = query[rows].float().view(len(quest), kvh, heads // kvh, hd)  # [nq, kvh, g, hd]
        ub = (torch.einsum("nhgd,nbhd->nhgb", q.clamp(min=0), hi)
              + torch.einsum("nhgd,nbhd->nhgb", q.clamp(max=0), lo)).amax(dim=2)  # [nq, kvh, w]
        blocks = torch.arange(width, device=dev)
        nb = torch.as_tensor(plan.num_blocks[quest], device=dev)
        ub = ub.masked_fill((blocks[None, :] >= nb[:, None])[:, None, :], float("-inf"))
        forced = torch.zeros((len(quest), width), dtype=torch.bool, device=dev)
        for j, s in enumerate(quest.tolist()):
            ids = torch.as_tensor(plan.indices[plan.indptr[s]:plan.indptr[s + 1]], device=dev)
            forced[j, ids.long()] = True
        ub = ub.masked_fill(forced[:, None, :], float("inf"))
        k = int(plan.budget[quest].max())
        top = ub.topk(min(k, width), dim=-1).indices                # [nq, kvh, k]
    pieces = []
    slot = {int(s): j for j, s in enumerate(quest)}
    for s in range(nd):
        if s in slot:
            b = int(plan.budget[s])
            chosen = top[slot[s], :, :b].sort(dim=-1).values           # [kvh, b]
            pieces.append(chosen.reshape(-1).to(torch.int32))
        else:
            ids = plan.indices[plan.indptr[s]:plan.indptr[s + 1]]
            pieces.append(torch.as_tensor(np.tile(ids, kvh), device=dev))
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int32, device=dev)
