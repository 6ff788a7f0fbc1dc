"""Attention over the paged KV cache: the per-step metadata and the calls into the kernels
(through pagedllm.ops, which picks the CPU or the CUDA ones by the cache's device).

A step's tokens are packed: first `num_decode_seqs` sequences with one new token each (the
decode kernel), then sequences with one or more new tokens (prefill, whole or a chunk, possibly
after a cached prefix: the prefill kernel). Each sequence's new tokens are the last
q_len of its context_len tokens, attended causally.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

import torch

from pagedllm import ops
from pagedllm.sparse.attend import sparse_decode
from pagedllm.sparse.key_bounds import update_key_bounds


@dataclass
class AttentionMetadata:
    """Where the new tokens' K/V go and what each sequence attends to, for one step.

    Args:
        slot_mapping: [num_tokens] int64, the cache slot (block * block_size + offset) of each
            new token; -1 skips the write (padding).
        block_tables: [num_seqs, W] int32, each sequence's physical blocks in order (pad: any id).
        context_lens: [num_seqs] int32, tokens of context after this step (cached + new).
        cu_seqlens_q: [num_seqs + 1] int32, prefix sums of the new-token counts (starts at 0).
        num_decode_seqs: the first num_decode_seqs sequences have exactly one new token each and
            come first in the packed batch; they go to the decode kernel, the rest to prefill.
        cu_seqlens_q_host: a host copy of cu_seqlens_q (numpy or CPU tensor) to check the
            values against when the tensors live on a device, so no check waits on it
            (None: the values are checked only for host tensors).
        sparse: the decode rows' block-sparse lists (pagedllm.sparse.attend.SparseStep), or
            None (dense).
    Raises:
        ValueError: a tensor of the wrong dtype or rank, or counts that do not add up.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    num_decode_seqs: int
    cu_seqlens_q_host: Optional[object] = field(default=None, repr=False)
    # Block-sparse decode (pagedllm.sparse.attend.SparseStep); None: every block is read.
    sparse: Optional[object] = field(default=None, repr=False)
    # Derived once per step (not per layer) by __post_init__; the views below on first use
    # (the decoder stack reads none of them).
    num_seqs: int = field(init=False)
    num_tokens: int = field(init=False)
    num_prefill_seqs: int = field(init=False)

    def __post_init__(self) -> None:
        _check(self.slot_mapping, "slot_mapping", 1, (torch.int64, torch.int32))
        _check(self.block_tables, "block_tables", 2, (torch.int32,))
        _check(self.context_lens, "context_lens", 1, (torch.int32,))
        _check(self.cu_seqlens_q, "cu_seqlens_q", 1, (torch.int32,))
        self.num_seqs = self.context_lens.shape[0]
        self.num_tokens = self.slot_mapping.shape[0]
        nd = self.num_decode_seqs
        if (self.block_tables.shape[0] != self.num_seqs
                or self.cu_seqlens_q.shape[0] != self.num_seqs + 1):
            raise ValueError(
                f"block_tables has {self.block_tables.shape[0]} rows and cu_seqlens_q "
                f"{self.cu_seqlens_q.shape[0]} entries: expected num_seqs = {self.num_seqs} "
                f"(from context_lens) and num_seqs + 1")
        if not 0 <= nd <= self.num_seqs:
            raise ValueError(f"num_decode_seqs = {nd}: expected 0..{self.num_seqs}")
        cu = self.cu_seqlens_q
        # The values are read from the host copy (or a host tensor): no check waits on a device.
        host = self.cu_seqlens_q_host if self.cu_seqlens_q_host is not None else (
            cu if cu.device.type == "cpu" else None)
        if host is not None and (len(host) != self.num_seqs + 1 or int(host[0]) != 0
                                 or int(host[nd]) != nd or int(host[-1]) != self.num_tokens):
            raise ValueError(
                f"cu_seqlens_q must start at 0, reach num_decode_seqs = {nd} after the decode "
                f"sequences and end at num_tokens = {self.num_tokens}; got cu[0] = {int(host[0])}, "
                f"cu[{nd}] = {int(host[nd])}, cu[-1] = {int(host[-1])}")
        self.num_prefill_seqs = self.num_seqs - nd

    @cached_property
    def decode_block_tables(self) -> torch.Tensor:
        """[num_decode_seqs, W] int32: the decode sequences' block tables."""
        return self.block_tables[:self.num_decode_seqs]

    @cached_property
    def decode_context_lens(self) -> torch.Tensor:
        """[num_decode_seqs] int32."""
        return self.context_lens[:self.num_decode_seqs]

    @cached_property
    def prefill_block_tables(self) -> torch.Tensor:
        """[num_prefill_seqs, W] int32."""
        return self.block_tables[self.num_decode_seqs:]

    @cached_property
    def prefill_context_lens(self) -> torch.Tensor:
        """[num_prefill_seqs] int32."""
        return self.context_lens[self.num_decode_seqs:]

    @cached_property
    def prefill_cu_seqlens_q(self) -> torch.Tensor:
        """[num_prefill_seqs + 1] int32: the prefill sequences' prefix sums, from 0."""
        nd, cu = self.num_decode_seqs, self.cu_seqlens_q
        if not nd:
            return cu
        if self.num_prefill_seqs:
            return cu[nd:] - nd
        return cu[:1]  # decode only: [0] (cu[0]), a view, no tensor op


def _check(t: torch.Tensor, name: str, dim: int, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != dim or t.dtype not in dtypes:
        got = f"{t.dtype} of rank {t.dim()}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a rank-{dim} tensor of {[str(d) for d in dtypes]}, "
                         f"got {got}")


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, kv_cache_dtype: str = "auto", k_scale: float = 1.0,
                    v_scale: float = 1.0,
                    key_bounds: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                    ) -> torch.Tensor:
    """Writes the new keys/values into their slots, then attends every new token to its context.

    Args:
        query: [num_tokens, num_heads, head_dim].
        key, value: [num_tokens, num_kv_heads, head_dim], the new tokens' (RoPE'd) keys and values.
        key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_dim] of this layer.
        meta: the step's AttentionMetadata.
        scale: softmax scale, head_dim ** -0.5 for Llama.
        kv_cache_dtype, k_scale, v_scale: the cache storage as the kernels name it.
        key_bounds: this layer's per-block key (min, max) [num_blocks, num_kv_heads, head_dim]
            when the pool keeps them (quest): updated for the blocks written here.
    Returns:
        out: [num_tokens, num_heads, head_dim] in query's dtype.
    """
    ops.reshape_and_cache(key, value, key_cache, value_cache, meta.slot_mapping,
                            kv_cache_dtype, k_scale, v_scale)
    if key_bounds is not None:
        update_key_bounds(key_cache, key_bounds[0], key_bounds[1], meta.slot_mapping,
                          kv_cache_dtype)
    # out: [num_tokens, num_heads, head_dim]
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    nd = meta.num_decode_seqs
    if nd and meta.sparse is not None:
        sparse_decode(out[:nd], query[:nd], key_cache, value_cache, meta.decode_block_tables,
                      meta.decode_context_lens, meta.sparse, key_bounds, scale, kv_cache_dtype,
                      k_scale, v_scale)
    elif nd:
        ops.paged_attention_decode(out[:nd], query[:nd], key_cache, value_cache,
                                     meta.decode_block_tables, meta.decode_context_lens, scale,
                                     kv_cache_dtype, k_scale, v_scale)
    if meta.num_prefill_seqs:
        ops.paged_attention_prefill(out[nd:], query[nd:], key_cache, value_cache,
                                      meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
                                      meta.prefill_context_lens, scale, kv_cache_dtype,
                                      k_scale, v_scale)
    return out
