"""Where the engine runs: device selection and sizing the KV pool from free GPU memory.

The engine's config gains `device` ("auto" | "cpu" | "cuda"; "auto" picks the GPU when the
CUDA kernels are compiled in, a GPU is visible and the model's head_dim is one they are compiled
for: the bundled model's 32 is not, so it stays on the CPU) and, on the GPU, `gpu_memory_utilization`
(the share of the device's memory the engine may use, vLLM's name). After the weights are loaded
and one profiling step has run, the KV pool gets what is left of that share.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from pagedllm import _core, ops
from pagedllm.model.errors import CheckpointError
from pagedllm.model.files import read_json

logger = logging.getLogger("pagedllm")

DEVICES = ("auto", "cpu", "cuda")


def cuda_head_dims() -> tuple[int, ...]:
    """The head dims compiled into the CUDA attention kernels (empty without them)."""
    cuda = getattr(_core, "cuda", None)
    return tuple(cuda.attention_head_dims()) if cuda is not None else ()


def checkpoint_head_dim(path: str | os.PathLike) -> Optional[int]:
    """The attention head_dim of the checkpoint at `path` from its config.json (a multimodal
    model's text_config), or None where that file does not say (the loader then reports it).

    Args:
        path: the checkpoint directory.
    Returns:
        head_dim, or hidden_size / num_attention_heads (ModelConfig's rule), or None.
    """
    try:  # read_json: a regular file only (a FIFO named config.json is refused, not waited on)
        cfg = read_json(os.path.join(os.fspath(path), "config.json"))
    except CheckpointError:
        return None
    text = cfg.get("text_config")
    cfg = text if isinstance(text, dict) else cfg
    head_dim, hidden, heads = (cfg.get(k) for k in ("head_dim", "hidden_size",
                                                    "num_attention_heads"))
    if isinstance(head_dim, int):
        return head_dim
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
        return hidden // heads
    return None


def resolve_device(option: str = "auto", head_dim: Optional[int] = None) -> torch.device:
    """The torch device the engine runs on.

    Args:
        option: "auto" (the GPU when usable, else the CPU), "cpu" or "cuda" / "cuda:N".
        head_dim: the model's attention head_dim, when known: "auto" takes the CPU for a
            head_dim the CUDA kernels are not compiled for (the bundled model's 32, say), and
            "cuda" refuses it here rather than at every step.
    Returns:
        The device; a CUDA one always with its index ("cuda" is the current GPU).
    Raises:
        ValueError: an unknown option.
        RuntimeError: "cuda" was asked for but no GPU or no CUDA build is available, or
            "cuda:N" names a GPU that is not visible, or the model's head_dim is not compiled.
    """
    name = option.split(":")[0]
    if name not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)} (or cuda:N), got {option!r}")
    usable = ops.cuda_available() and torch.cuda.is_available()
    why_not = None  # why the CUDA kernels cannot run this model, if they cannot
    if usable and head_dim is not None and head_dim not in cuda_head_dims():
        why_not = (f"the model's head_dim {head_dim} is not compiled into the CUDA attention "
                   f"kernels (supported: {', '.join(map(str, cuda_head_dims()))})")
    if name == "auto":
        if why_not:
            logger.info("device auto: the CPU, because %s", why_not)
            return torch.device("cpu")
        return torch.device("cuda", 0) if usable else torch.device("cpu")
    if name == "cuda" and not usable:
        why = ("pagedllm was built without the CUDA kernels" if getattr(_core, "cuda", None)
               is None else "no CUDA GPU is visible to pagedllm and torch")
        raise RuntimeError(f"device {option!r} was requested but {why}; use device='cpu'")
    if name == "cuda" and why_not:
        raise RuntimeError(f"device {option!r} was requested but {why_not}; use device='cpu'")
    device = torch.device(option)
    if device.type == "cuda":
        # Always with an index: torch.cuda.set_device (torch >= 2.11) refuses a bare "cuda".
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if device.index is None else device.index
        if not 0 <= index < count:
            raise RuntimeError(f"device {option!r} was requested but only {count} CUDA GPU(s) "
                               f"are visible (cuda:0 .. cuda:{count - 1})")
        device = torch.device("cuda", index)
    return device


def model_dtype_for(device: torch.device, requested: torch.dtype | None = None) -> torch.dtype:
    """Weights' dtype: the request, else bfloat16 on a GPU with bf16 support, float16 on an
    older GPU, float32 on the CPU."""
    if requested is not None:
        return requested
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def kv_budget_bytes(free_bytes: int, total_bytes: int, utilization: float,
                    reserve_bytes: int = 0) -> int:
    """Bytes the KV pool may take on a GPU.

    The engine may use `utilization` of the device's memory in all; what is in use now (weights,
    the profiling step's activations, other processes) counts against that share, and
    `reserve_bytes` more is kept for activations that the profile did not see.

    Args:
        free_bytes, total_bytes: from _core.cuda.mem_get_info (or torch.cuda.mem_get_info).
        utilization: fraction of total_bytes, in (0, 1].
        reserve_bytes: headroom to leave.
    Returns:
        The budget in bytes.
    Raises:
        ValueError: a bad fraction, or nothing left for the KV pool (the message gives the
            figures and the knob to turn).
    """
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    used = total_bytes - free_bytes
    budget = int(total_bytes * utilization) - used - reserve_bytes
    if budget <= 0:
        gib = 1 << 30
        raise ValueError(
            f"no GPU memory left for the KV cache: gpu_memory_utilization={utilization} allows "
            f"{total_bytes * utilization / gib:.2f} GiB of {total_bytes / gib:.2f} GiB, but "
            f"{used / gib:.2f} GiB are already in use (weights, activations, other processes) "
            f"and {reserve_bytes / gib:.2f} GiB are reserved; raise gpu_memory_utilization or "
            f"use a smaller model")
    return budget


def gpu_kv_budget_bytes(device: torch.device, utilization: float, reserve_bytes: int = 0) -> int:
    """kv_budget_bytes with the device's current free / total memory."""
    free, total = torch.cuda.mem_get_info(device)
    return kv_budget_bytes(free, total, utilization, reserve_bytes)


def _host_available_bytes() -> Optional[int]:
    """Memory this process may still take on the host: /proc/meminfo's MemAvailable, bounded
    by a cgroup v2 limit (memory.max - memory.current) where one is set; None where neither
    is readable."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                found.append(max(0, int(limit) - int(f.read().strip())))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def available_bytes(device: torch.device) -> Optional[int]:
    """Bytes still free for new tensors on `device`: the GPU's free memory, or the host's
    available memory (None where the host does not say)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return _host_available_bytes()


def check_fits(nbytes: int, device: torch.device, what: str, knob: str) -> None:
    """Refuses an allocation that cannot fit, before it is tried (a 200 GiB KV pool used to
    fail inside torch's allocator with "please report it").

    Args:
        nbytes: the bytes to allocate.
        device: where.
        what: what they are, with the option that sized them (e.g. "the KV pool (40000
            blocks, kv_cache_memory_bytes=...)").
        knob: what to lower, named as an option and a flag.
    Raises:
        ValueError: more than `device` has available (the message gives both figures).
    """
    free = available_bytes(device)
    if free is None or nbytes <= free:
        return
    where = "the GPU" if device.type == "cuda" else "this host"
    raise ValueError(f"{what} takes {_size(nbytes)}, but {where} has {_size(free)} available; "
                     f"lower {knob}")


def _size(nbytes: int) -> str:
    """Bytes as GiB (2 decimals), or MiB (1 decimal) under 1 GiB."""
    return (f"{nbytes / (1 << 30):.2f} GiB" if nbytes >= 1 << 30
            else f"{nbytes / (1 << 20):.1f} MiB")
