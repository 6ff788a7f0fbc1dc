"""Cross-attention over paged blocks (Mllama): the per-step metadata and the kernel call.

Each sequence with images holds its vision tokens' K/V (one per valid tile patch, image after
image) in blocks of its own CROSS block table, in a pool of the cross-attention layers only
(a PagedKVCache whose "layers" are the model's cross-attention layers). Query token i of the
step attends, non-causally, its sequence's cross tokens kv_ranges[i, 0] <= j < kv_ranges[i, 1];
an empty range gives a zero row (and the layer's MLP is masked for it: row_mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedllm import ops
from pagedllm.model.kv_cache import PagedKVCache


@dataclass
class CrossAttentionMetadata:
    """What the cross-attention layers of one step read.

    Args:
        kv: the cross pool (one "layer" per cross-attention layer).
        block_tables: [num_seqs, W] int32, each sequence's cross blocks (a row of zeros and
            context_len 0 for a sequence without images).
        context_lens: [num_seqs] int32, cross tokens stored per sequence.
        cu_seqlens_q: [num_seqs + 1] int32, the step's packed query tokens per sequence.
        kv_ranges: [num_tokens, 2] int32, the cross tokens [lo, hi) each query token sees.
    Attributes:
        row_mask: [num_tokens, 1] bool, True where the row sees at least one cross token (the
            cross-attention layers' MLP is masked to these rows).
    """

    kv: PagedKVCache
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    kv_ranges: torch.Tensor
    row_mask: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.row_mask = (self.kv_ranges[:, 1] > self.kv_ranges[:, 0]).unsqueeze(1)


def paged_cross_attention(query: torch.Tensor, meta: CrossAttentionMetadata, layer: int,
                          scale: float) -> torch.Tensor:
    """Attends every query row to its range of its sequence's cross tokens.

    Args:
        query: [num_tokens, num_heads, head_dim].
        meta: the step's CrossAttentionMetadata.
        layer: the cross pool layer (the index among the cross-attention layers).
        scale: softmax scale.
    Returns:
        out: [num_tokens, num_heads, head_dim] in query's dtype (zero rows for empty ranges).
    """
    kv = meta.kv
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    ops.paged_cross_attention(out, query, kv.key_cache(layer), kv.value_cache(layer),
                              meta.block_tables, meta.cu_seqlens_q, meta.context_lens,
                              meta.kv_ranges, scale, kv.kernel_kv_dtype, kv.k_scale, kv.v_scale)
    return out
