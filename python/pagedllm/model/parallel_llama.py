"""The Llama of one tensor-parallel rank: LlamaForCausalLM on the rank's shapes, with the
layers that talk to the other ranks swapped in (see tensor_parallel.py for who holds what).

Per layer: qkv_proj and gate_up_proj are the plain Linear of the rank's shapes (column-parallel:
the loader fills them with the rank's rows); o_proj and down_proj are `RowParallelLinear` (the
rank's columns, partial sums all-reduced, the bias added once after). The embedding is
`VocabParallelEmbedding` (rows outside the rank's vocabulary shard are zero, then all-reduced);
`compute_logits` multiplies by the rank's lm_head (or tied embedding) rows and gathers the
shards on rank 0. Two all-reduces per layer, one for the embedding, one gather per step.
Parameter names are LlamaForCausalLM's, so the loader's name table applies unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F

from pagedllm.model import packed_linear
from pagedllm.model.config import ModelConfig
from pagedllm.model.llama import Embedding, Linear, LlamaForCausalLM
from pagedllm.model.tensor_parallel import Comm, TPShard, shard_config, vocab_rows


class RowParallelLinear(Linear):
    """y = all_reduce(x @ W_r.T) + bias, W_r [out_features, in_features / tp] (this rank's
    columns); the bias is whole and added once, after the sum.

    Args:
        in_features: this rank's share of the input width.
        out_features: the full output width.
        bias, dtype: as Linear.
        comm: the group's collectives.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 comm: Comm) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [n, in_features / tp] -> partial y: [n, out_features], summed over the ranks
        if self.packed is not None:
            y = packed_linear.linear(x, self.packed, None)
        else:
            y = F.linear(x, self.weight)
        self.comm.all_reduce(y)
        if self.bias is not None:
            y += self.bias
        return y


class VocabParallelEmbedding(Embedding):
    """Row lookup in this rank's vocabulary rows [start, end) (weight [padded, hidden]); ids
    outside give zero rows, and the all-reduce assembles every id's row.

    Args:
        start, end, padded: vocab_rows() of the rank.
        hidden_size, dtype: as Embedding.
        comm: the group's collectives.
    """

    def __init__(self, start: int, end: int, padded: int, hidden_size: int, dtype: torch.dtype,
                 comm: Comm) -> None:
        super().__init__(padded, hidden_size, dtype)
        self.start, self.end = start, end
        self.comm = comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [n] int64 (global) -> [n, hidden_size]
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill_(outside, 0)
        x = self.lookup(local)
        x.masked_fill_(outside.unsqueeze(1), 0.0)
        self.comm.all_reduce(x)
        return x


class ParallelLlamaForCausalLM(LlamaForCausalLM):
    """One rank's LlamaForCausalLM (uninitialised: `load_model_shard` fills it).

    Args:
        config: the whole model's config (the rank's shapes are derived from it).
        shard: which rank this is, of how many.
        comm: the group's collectives (rank and world_size agree with shard).
        dtype: the model dtype.
    """

    def __init__(self, config: ModelConfig, shard: TPShard, comm: Comm,
                 dtype: torch.dtype = torch.float32) -> None:
        start, end, padded = vocab_rows(config, shard)
        # The rank's shapes; its vocabulary is its padded shard (so lm_head is built at that
        # size; the special token ids, checked against the whole vocabulary, are dropped).
        local = dataclasses.replace(shard_config(config, shard.world_size), vocab_size=padded,
                                    bos_token_id=None, eos_token_ids=())
        super().__init__(local, dtype)
        self.full_config, self.shard, self.comm = config, shard, comm
        self.embed_tokens = VocabParallelEmbedding(start, end, padded, config.hidden_size, dtype,
                                                   comm)
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.o_proj = RowParallelLinear(local.q_size, config.hidden_size,
                                            config.attention_bias, dtype, comm)
            mlp.down_proj = RowParallelLinear(local.intermediate_size, config.hidden_size,
                                              config.mlp_bias, dtype, comm)

    @property
    def vocab_size(self) -> int:
        """The whole vocabulary (compute_logits' width on rank 0)."""
        return self.full_config.vocab_size

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of the given rows, gathered on rank 0.

        Args:
            hidden: [n, hidden_size], rows of forward's output (the same rows on every rank).
        Returns:
            rank 0: logits [n, vocab_size] float32; other ranks: an empty [n, 0] float32 tensor
            (they take part in the gather and sample nothing).
        """
        head = self.embed_tokens.logits if self.lm_head is None else self.lm_head
        local = head(hidden).float()                           # [n, padded]
        full: Optional[torch.Tensor] = self.comm.gather_last_dim(local)
        if full is None:
            return local.new_empty((hidden.shape[0], 0))
        return full[:, :self.vocab_size]                       # [n, vocab_size]
