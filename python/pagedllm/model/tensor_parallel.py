"""Megatron-style tensor parallelism: which slice of every weight and KV head a rank holds.

With `world_size` ranks (tensor_parallel_size), rank r holds:

- attention: query heads [r * H/tp, (r + 1) * H/tp) and the KV heads they read. With
  KV >= tp, KV heads [r * KV/tp, (r + 1) * KV/tp); with KV < tp (tp a multiple of KV), the
  one KV head its query heads share, replicated on tp/KV ranks (vLLM does the same). qkv_proj
  is column-parallel (its rows for those heads), o_proj row-parallel (its columns for them).
- MLP: intermediate rows [r * I/tp, (r + 1) * I/tp) of gate_up (column-parallel), the same
  columns of down_proj (row-parallel).
- embedding and lm_head: vocabulary rows [r * Vp, min(V, (r + 1) * Vp)) with Vp = ceil(V/tp);
  the last rank's shard is zero-padded to Vp rows.
- norms, RoPE and the biases of the row-parallel layers: whole (biases added once, after the
  all-reduce).

The KV pool of a rank holds only its KV heads, so its blocks are 1/tp (or 1/KV with
replication) of a whole block; block ids are the same on every rank (one KV manager on the
driver). `Comm` is what the sharded model needs of torch.distributed (all-reduce, a gather to
rank 0); a rank's model never imports torch.distributed itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from pagedllm.model.config import ModelConfig


class Comm(Protocol):
    """The collectives of one tensor-parallel group."""

    rank: int
    world_size: int

    def all_reduce(self, t: torch.Tensor) -> None:
        """Sums t over the ranks, in place."""

    def gather_last_dim(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """Rank 0: the ranks' t concatenated along the last dim; other ranks: None."""


@dataclass(frozen=True)
class TPShard:
    """One rank's share of a model.

    Attributes:
        rank: 0..world_size-1.
        world_size: tensor_parallel_size.
    """

    rank: int
    world_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank}: expected 0..{self.world_size - 1}")


def check_divisible(config: ModelConfig, tp: int) -> None:
    """Raises ValueError (naming tensor_parallel_size) when `config` cannot be split tp ways."""
    h, kv, f = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if h % tp:
        raise ValueError(f"tensor_parallel_size={tp} must divide num_attention_heads={h}")
    if kv % tp and tp % kv:
        raise ValueError(f"tensor_parallel_size={tp} must divide num_key_value_heads={kv} or be "
                         f"a multiple of it (KV heads are split, or replicated when fewer)")
    if f % tp:
        raise ValueError(f"tensor_parallel_size={tp} must divide intermediate_size={f}")


def local_kv_heads(config: ModelConfig, tp: int) -> int:
    """KV heads each rank holds (KV/tp, or 1 when KV < tp: replicated)."""
    return max(1, config.num_key_value_heads // tp)


def kv_head_start(config: ModelConfig, shard: TPShard) -> int:
    """The first KV head of a rank (its query heads read KV heads from here)."""
    kv, tp = config.num_key_value_heads, shard.world_size
    if kv >= tp:
        return shard.rank * (kv // tp)
    return shard.rank * (config.num_attention_heads // tp) // config.num_kv_groups


def vocab_rows(config: ModelConfig, shard: TPShard) -> tuple[int, int, int]:
    """(start, end, padded) vocabulary rows of a rank: it holds [start, end), padded rows."""
    padded = -(-config.vocab_size // shard.world_size)
    start = min(config.vocab_size, shard.rank * padded)
    return start, min(config.vocab_size, start + padded), padded


def shard_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The per-rank shapes: heads, KV heads and intermediate size divided (vocab kept; the
    vocab-parallel layers shard it themselves). The KV pool and the layers are built on it."""
    check_divisible(config, tp)
    return dataclasses.replace(config, num_attention_heads=config.num_attention_heads // tp,
                               num_key_value_heads=local_kv_heads(config, tp),
                               intermediate_size=config.intermediate_size // tp)
