"""Where the engine runs: device selection and sizing the KV pool from free GPU memory.

The engine's config gains `device` ("auto" | "cpu" | "cuda"; "auto" picks the GPU when the
CUDA kernels are compiled in and a GPU is visible) and, on the GPU, `gpu_memory_utilization`
(the share of the device's memory the engine may use, vLLM's name). After the weights are loaded
and one profiling step has run, the KV pool gets what is left of that share.
"""

from __future__ import annotations

import torch

from pagedllm import _core, ops

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(option: str = "auto") -> torch.device:
    """The torch device the engine runs on.

    Args:
        option: "auto" (the GPU when usable, else the CPU), "cpu" or "cuda" / "cuda:N".
    Returns:
        The device; a CUDA one always with its index ("cuda" is the current GPU).
    Raises:
        ValueError: an unknown option.
        RuntimeError: "cuda" was asked for but no GPU or no CUDA build is available, or
            "cuda:N" names a GPU that is not visible.
    """
    name = option.split(":")[0]
    if name not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)} (or cuda:N), got {option!r}")
    usable = ops.cuda_available() and torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda", 0) if usable else torch.device("cpu")
    if name == "cuda" and not usable:
        why = ("pagedllm was built without the CUDA kernels" if getattr(_core, "cuda", None)
               is None else "no CUDA GPU is visible to pagedllm and torch")
        raise RuntimeError(f"device {option!r} was requested but {why}; use device='cpu'")
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
