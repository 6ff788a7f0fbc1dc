"""The safetensors side of loading a checkpoint directory: which files to read (a single
model.safetensors or the shards an index names; pickles refused), every tensor's header
(file, shape, dtype) without reading data, and copying named tensors into rows of model
parameters with a finiteness check. Shared by the Llama loader (loader.py), the LLaVA loader
and the tensor-parallel shard loader; any problem raises CheckpointError naming the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
from safetensors import SafetensorError, safe_open

from pagedllm.model.config import read_json
from pagedllm.model.errors import CheckpointError
from pagedllm.model.files import check_regular_file
from pagedllm.model.weight_names import TensorSlot

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
USABLE_DTYPES = ("F32", "F16", "BF16")
SUPPORTED_MODEL_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor is and what its header says."""


    file: str
    shape: tuple[int, ...]
    dtype: str


def all_finite(t: torch.Tensor) -> bool:
    """True when t holds no NaN or infinity."""
    # aminmax propagates NaN and shows +-inf; ~40x faster than isfinite().all() on this CPU.
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def weight_files(path: str) -> tuple[list[str], Optional[dict[str, str]]]:
    """The safetensors files to read, and the index's name -> file map (None without index)."""
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.lexists(index_path):
        index = read_json(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise CheckpointError(f"{index_path}: expected a non-empty 'weight_map' object of "
                                  f"tensor name -> file name")
        files = []
        for fname in dict.fromkeys(weight_map.values()):
            full = os.path.join(path, fname)
            if os.path.basename(fname) != fname or not os.path.lexists(full):
                raise CheckpointError(f"{index_path}: lists shard {fname!r}, which is not a file "
                                      f"in {path}")
            check_regular_file(full)
            files.append(full)
        return files, {k: os.path.join(path, v) for k, v in weight_map.items()}
    single = os.path.join(path, SINGLE_FILE)
    if os.path.lexists(single):
        check_regular_file(single)
        return [single], None
    pickles = [f for f in sorted(os.listdir(path)) if f.endswith((".bin", ".pt", ".pth"))]
    hint = (f" (found {pickles[0]}: pickle checkpoints are refused, convert it to safetensors)"
            if pickles else "")
    raise CheckpointError(f"{path}: no {SINGLE_FILE} and no {INDEX_FILE}{hint}")


def scan(files: list[str]) -> dict[str, TensorInfo]:
    """Every tensor's file, shape and dtype, from the headers only (no data read)."""
    found: dict[str, TensorInfo] = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    info = TensorInfo(file, tuple(sl.get_shape()), sl.get_dtype())
                    if name in found:
                        raise CheckpointError(f"{file}: tensor {name!r} also appears in "
                                              f"{found[name].file}; expected it once")
                    found[name] = info
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a valid safetensors file, truncated or corrupt "
                                  f"({e})") from None
        except OSError as e:
            raise CheckpointError(f"{file}: cannot be read ({e})") from None
    return found


def fill(file: str, names: list[str], slots: dict[str, TensorSlot],
          params: dict[str, torch.nn.Parameter]) -> None:
    """Copies each named tensor of `file` into its rows of the model parameter."""
    try:
        with safe_open(file, framework="pt") as f:
            for name in names:
                slot = slots[name]
                dst = params[slot.param].data[slot.row_offset:slot.row_offset + slot.shape[0]]
                dst.copy_(f.get_tensor(name))
                if not all_finite(dst):
                    raise CheckpointError(f"{file}: tensor {name!r} contains NaN or infinite "
                                          f"values (after conversion to {dst.dtype})")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: reading the tensors failed ({e})") from None
