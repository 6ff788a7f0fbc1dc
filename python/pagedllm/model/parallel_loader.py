"""load_model_shard: one tensor-parallel rank's slices of a checkpoint, read straight from the
safetensors files (memory-mapped `get_slice`: a rank reads only its rows or columns).

The checkpoint is checked exactly as load_model checks it (loader.inspect_checkpoint: every
header, shape and dtype), then `shard_slices` says, for every checkpoint tensor, which rows
(column-parallel layers, vocabulary shards) or columns (row-parallel layers) this rank takes
and where they go in its ParallelLlamaForCausalLM (tensor_parallel.py has the split).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

import torch
from safetensors import SafetensorError, safe_open

from pagedllm.model.config import ModelConfig
from pagedllm.model.errors import CheckpointError
from pagedllm.model.loader import inspect_checkpoint
from pagedllm.model.safetensors_files import SUPPORTED_MODEL_DTYPES, all_finite
from pagedllm.model.parallel_llama import ParallelLlamaForCausalLM
from pagedllm.model.tensor_parallel import (Comm, TPShard, kv_head_start, local_kv_heads,
                                            shard_config, vocab_rows)
from pagedllm.model.weight_names import expected_tensors

_PROJ = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.(weight|bias)$")


@dataclass(frozen=True)
class ShardSlice:
    """What a rank reads of one checkpoint tensor and where it goes.

    Attributes:
        param: the parameter name (LlamaForCausalLM's).
        row_offset: first row of the parameter the slice fills.
        dim: None (the whole tensor), 0 (rows [start, stop)) or 1 (columns [start, stop)).
        start, stop: the range along dim.
    """

    param: str
    row_offset: int = 0
    dim: Optional[int] = None
    start: int = 0
    stop: int = 0


def shard_slices(config: ModelConfig, shard: TPShard) -> dict[str, ShardSlice]:
    """Every checkpoint tensor of `config` -> the slice rank `shard.rank` reads.

    Raises:
        ValueError: config cannot be split world_size ways (names tensor_parallel_size).
    """
    tp, r = shard.world_size, shard.rank
    local = shard_config(config, tp)
    d = config.head_dim
    q0, q1 = r * local.q_size, (r + 1) * local.q_size
    k0 = kv_head_start(config, shard) * d
    k1 = k0 + local_kv_heads(config, tp) * d
    f0, f1 = r * local.intermediate_size, (r + 1) * local.intermediate_size
    v0, v1, _ = vocab_rows(config, shard)
    out: dict[str, ShardSlice] = {}
    for name, slot in expected_tensors(config).items():
        m = _PROJ.search(name)
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            out[name] = ShardSlice(slot.param, 0, 0, v0, v1)
        elif m is None:
            out[name] = ShardSlice(slot.param)
        else:
            proj, kind = m.groups()
            if proj == "q":
                out[name] = ShardSlice(slot.param, 0, 0, q0, q1)
            elif proj in ("k", "v"):
                offset = local.q_size + (0 if proj == "k" else local.kv_size)
                out[name] = ShardSlice(slot.param, offset, 0, k0, k1)
            elif proj in ("gate", "up"):
                offset = 0 if proj == "gate" else local.intermediate_size
                out[name] = ShardSlice(slot.param, offset, 0, f0, f1)
            elif kind == "bias":  # o_proj / down_proj bias: whole, added after the all-reduce
                out[name] = ShardSlice(slot.param)
            else:
                lo, hi = (q0, q1) if proj == "o" else (f0, f1)
                out[name] = ShardSlice(slot.param, 0, 1, lo, hi)
    return out


def load_model_shard(path: str | os.PathLike, shard: TPShard, comm: Comm,
                     dtype: torch.dtype = torch.float32,
                     prepack: bool = False) -> tuple[ParallelLlamaForCausalLM, ModelConfig]:
    """Loads one rank's shard of a LlamaForCausalLM checkpoint directory.

    Args:
        path: the checkpoint directory (as load_model).
        shard: this rank and the tensor-parallel size.
        comm: the group's collectives (the model's all-reduces and logits gather).
        dtype, prepack: as load_model.
    Returns:
        (the rank's model in eval mode, the whole model's ModelConfig).
    Raises:
        CheckpointError: as load_model. ValueError: the model cannot be split this way.
    """
    if dtype not in SUPPORTED_MODEL_DTYPES:
        raise ValueError(f"dtype {dtype}: expected one of {SUPPORTED_MODEL_DTYPES}")
    config, _, by_file = inspect_checkpoint(path)
    slices = shard_slices(config, shard)
    model = ParallelLlamaForCausalLM(config, shard, comm, dtype)
    params = dict(model.named_parameters())
    for p in (model.embed_tokens.weight, None if model.lm_head is None else model.lm_head.weight):
        if p is not None:
            p.data.zero_()  # the padded vocabulary rows of the last rank stay zero
    for file, names in by_file.items():
        _fill_slices(file, names, slices, params)
    del params
    if prepack:
        model.prepack_weights()
    return model.eval(), config


def _fill_slices(file: str, names: list[str], slices: dict[str, ShardSlice],
                 params: dict[str, torch.nn.Parameter]) -> None:
    """Copies the rank's slice of each named tensor of `file` into its parameter rows."""
    try:
        with safe_open(file, framework="pt") as f:
            for name in names:
                s = slices[name]
                if s.dim is None:
                    src = f.get_tensor(name)
                elif s.dim == 0:
                    src = f.get_slice(name)[s.start:s.stop]
                else:
                    src = f.get_slice(name)[:, s.start:s.stop]
                dst = params[s.param].data[s.row_offset:s.row_offset + src.shape[0]]
                dst.copy_(src)
                if not all_finite(dst):
                    raise CheckpointError(f"{file}: tensor {name!r} contains NaN or infinite "
                                          f"values (after conversion to {dst.dtype})")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: reading the tensors failed ({e})") from None
