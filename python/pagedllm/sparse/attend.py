"""The worker side of a step's sparse plan: the decode rows' attention over the planned blocks.

Called by pagedllm.model.attention for the decode part of a step whose AttentionMetadata
carries a plan; the prefill part stays dense.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from pagedllm import ops
from pagedllm.sparse.plan import SparsePlan
from pagedllm.sparse.quest_select import quest_lists


@dataclass
class SparseStep:
    """A plan with its static lists as tensors on the pool's device (made once per step).

    Attributes:
        plan: the scheduler's plan.
        indptr, indices: the per-sequence lists (int32 tensors, indptr on the host for the CPU).
    """

    plan: SparsePlan
    indptr: torch.Tensor
    indices: torch.Tensor

    @classmethod
    def build(cls, plan: SparsePlan, device: torch.device) -> "SparseStep":
        """Uploads the plan's lists to `device`."""
        return cls(plan, torch.from_numpy(plan.indptr).to(device),
                   torch.from_numpy(plan.indices).to(device))


def sparse_decode(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                  value_cache: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor, step: SparseStep,
                  key_bounds: Optional[tuple[torch.Tensor, torch.Tensor]], scale: float,
                  kv_cache_dtype: str, k_scale: float, v_scale: float) -> None:
    """Decode attention of the step's decode rows over their planned blocks; writes out.

    Args:
        out, query: [num_decode_seqs, num_heads, head_dim].
        key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_dim].
        block_tables: [num_decode_seqs, W] int32; context_lens: [num_decode_seqs] int32.
        step: the step's sparse lists.
        key_bounds: (kmin, kmax) [num_blocks, num_kv_heads, head_dim] of this layer, needed
            when the plan is query-aware.
        scale, kv_cache_dtype, k_scale, v_scale: as for ops.paged_attention_decode.
    Raises:
        RuntimeError: a query-aware plan without key bounds (the pool keeps none).
    """
    indptr, indices = step.indptr, step.indices
    if step.plan.query_aware:
        if key_bounds is None:
            raise RuntimeError("a quest plan reached a pool without key bounds")
        indptr, indices = quest_lists(query, key_bounds[0], key_bounds[1], block_tables,
                                      step.plan, kv_cache_dtype)
        indptr = indptr.to(query.device)
    ops.paged_attention_decode_sparse(out, query, key_cache, value_cache, block_tables,
                                      context_lens, indptr, indices, scale, kv_cache_dtype,
                                      k_scale, v_scale)
