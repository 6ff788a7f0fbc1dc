"""Cache elements as float32 and back, for the key-bounds bookkeeping (fp8 caches are uint8
tensors of float8 bytes; their values are stored / k_scale, which bounds keep as they are)."""

from __future__ import annotations

import torch

_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2}


def as_float(stored: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """Stored cache elements as float32 (fp8 bytes decoded; no scale applied)."""
    if stored.dtype == torch.uint8:
        return stored.view(_FP8[kv_dtype]).float()
    return stored.float()


def from_float(x: torch.Tensor, storage: torch.dtype, kv_dtype: str) -> torch.Tensor:
    """float32 values that are exactly representable in the storage type, stored."""
    if storage == torch.uint8:
        return x.to(_FP8[kv_dtype]).view(torch.uint8)
    return x.to(storage)
