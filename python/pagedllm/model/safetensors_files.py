"""The safetensors side of loading a checkpoint directory: which files to read (a single
model.safetensors or the shards an index names; pickles refused), every tensor's header
(file, shape, dtype) without reading data, and copying named tensors into rows of model
parameters with a finiteness check; for the multimodal loaders, the match of a directory's
tensors against the model's expected ones with every problem listed at once. Shared by the
Llama loader (loader.py), the LLaVA and Mllama loaders and the tensor-parallel shard loader; any
problem raises CheckpointError naming the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

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


def same_values(found: dict[str, TensorInfo], a: str, b: str, rows: int = 4096) -> bool:
    """Whether tensors `a` and `b` (from scan()) hold equal values, compared `rows` rows at a
    time (a 1B model's embedding is 0.5-1 GB: never two whole copies in memory).

    Raises:
        CheckpointError: a file cannot be read.
    """
    ia, ib = found[a], found[b]
    if ia.shape != ib.shape:
        return False
    try:
        with safe_open(ia.file, framework="pt") as fa, safe_open(ib.file, framework="pt") as fb:
            sa, sb = fa.get_slice(a), fb.get_slice(b)
            for r in range(0, ia.shape[0] if ia.shape else 1, rows):
                xa = sa[r:r + rows] if ia.shape else fa.get_tensor(a)
                xb = sb[r:r + rows] if ib.shape else fb.get_tensor(b)
                if not torch.equal(xa.to(torch.float32), xb.to(torch.float32)):
                    return False
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{ia.file}: reading {a!r} and {b!r} failed ({e})") from None
    return True


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


MAX_LISTED = 12  # problems a match error lists before "... and N more"


def match_tensors(path: str, slots: dict[str, TensorSlot], found: dict[str, TensorInfo],
                  canonical: Callable[[str], str], architecture: str,
                  ignored: tuple[str, ...] = (),
                  tolerated: Callable[[str], bool] = lambda canon: False
                  ) -> dict[str, TensorSlot]:
    """Checkpoint name -> slot for every tensor to load.

    Args:
        path: the checkpoint directory (for the messages).
        slots: canonical name -> where it goes, every tensor the model expects.
        found: checkpoint name -> header, from scan().
        canonical: maps a checkpoint name (any supported layout) to its canonical name.
        architecture: the model class the names belong to, for "unexpected tensor" messages.
        ignored: name suffixes skipped (buffers some exports save).
        tolerated: canonical names that may be present without a slot (skipped, unused).
    Returns:
        checkpoint name -> slot.
    Raises:
        CheckpointError: listing every duplicate, unexpected, missing, wrong-dtype and
            wrong-shape tensor at once.
    """
    problems: list[str] = []
    by_ckpt: dict[str, TensorSlot] = {}
    seen: dict[str, str] = {}
    for name, info in found.items():
        if name.endswith(ignored):
            continue
        canon = canonical(name)
        if canon in seen:
            problems.append(f"{info.file}: tensor {name!r} and {seen[canon]!r} are the same "
                            f"weight ({canon}); expected it once")
            continue
        seen[canon] = name
        slot = slots.get(canon)
        if slot is None and tolerated(canon):
            continue
        if info.dtype not in USABLE_DTYPES:
            problems.append(f"{info.file}: tensor {name!r} has dtype {info.dtype}, expected one "
                            f"of {', '.join(USABLE_DTYPES)}")
        if slot is None:
            problems.append(f"{info.file}: unexpected tensor {name!r} (not part of a "
                            f"{architecture} with this config)")
        elif tuple(info.shape) != tuple(slot.shape):
            problems.append(f"{info.file}: tensor {name!r} has shape {list(info.shape)}, "
                            f"expected {list(slot.shape)}")
        else:
            by_ckpt[name] = slot
    problems += [f"{path}: missing tensor {canon!r}" for canon in slots if canon not in seen]
    if problems:
        listed = "\n  - ".join(problems[:MAX_LISTED])
        extra = len(problems) - MAX_LISTED
        more = f"\n  ... and {extra} more" if extra > 0 else ""
        raise CheckpointError(f"{path}: the weights do not match config.json "
                              f"({len(problems)} problem(s))\n  - {listed}{more}")
    return by_ckpt


def fill_matched(by_ckpt: dict[str, TensorSlot], found: dict[str, TensorInfo],
                 params: dict[str, torch.nn.Parameter]) -> None:
    """Copies every matched tensor into its parameter rows, one pass per file (see fill)."""
    by_file: dict[str, list[str]] = {}
    for name in by_ckpt:
        by_file.setdefault(found[name].file, []).append(name)
    for file, names in by_file.items():
        fill(file, names, by_ckpt, params)
