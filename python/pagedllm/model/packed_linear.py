"""Linear layers with weights prepacked once into oneDNN's blocked layout (CPU).

`F.linear` on a plain [out, in] weight re-blocks the weight for the GEMM micro-kernel on every
call. The decode steps of a serving engine have few rows (one per running sequence), so that
per-call reordering of the whole weight, not the arithmetic, sets their cost. oneDNN (torch's
mkldnn backend) can reorder a weight once into the layout its kernels read
(`torch.ops.mkldnn._reorder_linear_weight`) and then multiply against it directly
(`torch.ops.mkldnn._linear_pointwise`); this is what torch.compile's CPU backend (Inductor's
mkldnn weight prepacking) and vLLM's CPU build do. Measured on the "small" model
(docs/BENCHMARKS.md, "model_step" table): 1.25-1.5x faster decode steps of 16-64 sequences,
equal at one sequence and on prefill.

The packed weight is an opaque mkldnn tensor: it replaces the strided one (no second copy), so
code that reads `Linear.weight` after packing gets None. Results differ from `F.linear` only in
summation order (about 1e-6 relative in float32). Small weights (under MIN_PACKED_ELEMENTS) are
left strided, and row counts are bucketed (`padded_rows`) so that oneDNN's primitive cache is
not thrashed by the engine's ever-changing step sizes.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)

# Weights below this many elements stay strided: for them oneDNN's per-call overhead outweighs
# the reorder it saves. Measured in the engine (torch 2.13, 2-core Zen 4, "tiny": 256 x 256 to
# 1376 x 256 weights): packing them too makes decode steps 1.2-1.45x faster, fp32 and bf16, 1 to
# 64 sequences (F.linear re-blocks the weight on every call even at one row).
MIN_PACKED_ELEMENTS = 1 << 16

# oneDNN builds (and caches, 1024 entries by default) one primitive per (weight shape, row
# count); building one costs about a millisecond. Row counts are rounded up to buckets (exact to
# 16, then 8 per octave: 72 buckets up to 2048 rows, padding under 1/8 of the rows) so that an
# engine whose step sizes vary from 1 to thousands of tokens reuses a few hundred primitives.
EXACT_ROWS = 16


def worth_packing(weight: torch.Tensor) -> bool:
    """True when `weight` [out, in] is large enough that packing pays off."""
    return weight.numel() >= MIN_PACKED_ELEMENTS


def padded_rows(n: int) -> int:
    """The row count `linear` multiplies for n rows: n up to EXACT_ROWS, then n rounded up to
    a multiple of 2^(floor(log2 n) - 3)."""
    if n <= EXACT_ROWS:
        return n
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step


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
        y: [n, out_features] (contiguous).
    """
    n = x.shape[0]
    rows = padded_rows(n)
    if rows != n:  # rows are independent: zero rows in, rows dropped out
        padded = x.new_empty((rows, x.shape[1]))
        padded[:n].copy_(x)
        padded[n:].zero_()
        x = padded
    y = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return y[:n] if rows != n else y
