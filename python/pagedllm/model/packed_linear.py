"""Linear layers with weights prepacked once into oneDNN's blocked layout (CPU).

`F.linear` on a plain [out, in] weight re-blocks the weight for the GEMM micro-kernel on every
call. The decode steps of a serving engine have few rows (one per running sequence), so that
per-call reordering of the whole weight, not the arithmetic, sets their cost. oneDNN (torch's
mkldnn backend) can reorder a weight once into the layout its kernels read
(`torch.ops.mkldnn._reorder_linear_weight`) and then multiply against it directly
(`torch.ops.mkldnn._linear_pointwise`); this is what torch.compile's CPU backend (Inductor's
mkldnn weight prepacking) and vLLM's CPU build do. Measured on the "small" model
(docs/BENCHMARKS.md, "Model step"): 1.3-1.6x faster decode steps of 4-64 sequences, equal at
one sequence, 1.0-1.5x on prefill.

The packed weight is an opaque mkldnn tensor: it replaces the strided one (no second copy), so
code that reads `Linear.weight` after packing gets None. Results differ from `F.linear` only in
summation order (about 1e-6 relative in float32).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True when this torch build has oneDNN and the prepacked linear ops, and they agree with
    F.linear on a small product (checked once per process)."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(24, 40, generator=g)
        x = torch.randn(3, 40, generator=g)
        b = torch.randn(24, generator=g)
        y = linear(x, pack(w), b)
    except RuntimeError:
        return False
    return bool(torch.allclose(y, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-5))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """Reorders a linear weight once for `linear`.

    Args:
        weight: [out_features, in_features] float32 or bfloat16, on the CPU.
    Returns:
        The same matrix in oneDNN's blocked layout (an opaque mkldnn tensor).
    Raises:
        ValueError: a weight that is not a 2-D CPU float32/bfloat16 tensor.
    """
    if weight.dim() != 2 or weight.device.type != "cpu" or weight.dtype not in PACKABLE_DTYPES:
        raise ValueError(f"weight {list(weight.shape)} {weight.dtype} on {weight.device}: "
                         f"expected a 2-D float32 or bfloat16 CPU tensor")
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """y = x @ W.T + bias with W from `pack`.

    Args:
        x: [n, in_features], the dtype of the packed weight.
        packed: the packed [out_features, in_features] weight.
        bias: [out_features] or None.
    Returns:
        y: [n, out_features].
    """
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
