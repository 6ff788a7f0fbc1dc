"""Linear layers with weights prepacked once into the layout their GEMM kernel reads (CPU).

`F.linear` on a plain [out, in] weight re-blocks the weight for the GEMM micro-kernel on every
call. The decode steps of a serving engine have few rows (one per running sequence), so that
per-call reordering of the whole weight, not the arithmetic, sets their cost. Two backends
pack a weight once instead:

- "pagedllm": `_core.linear` (pagedllm/kernels/linear.h) over 16-column panels, AVX-512 float32
  and AVX512_BF16 bfloat16 register tiles (AVX2 ones elsewhere). At 1-16 rows it streams every
  weight byte once at the read bandwidth; measured on a 2-core Zen 4 (docs/BENCHMARKS.md,
  "Linear layers"): 1.4-2.1x oneDNN's prepacked kernels at one row, 1.0-2.3x at 16, 0.8-1.3x
  from 64 rows to prefill sizes.
- "onednn": torch's mkldnn backend reorders the weight into oneDNN's blocked layout
  (`torch.ops.mkldnn._reorder_linear_weight`) and multiplies against it directly
  (`torch.ops.mkldnn._linear_pointwise`), as torch.compile's CPU backend (Inductor's mkldnn
  weight prepacking) and vLLM's CPU build do.

`choose_backend` picks "pagedllm" for float32 on CPUs with AVX-512, for bfloat16 on CPUs with
AVX512_BF16 that lack AMX (with AMX oneDNN's bfloat16 GEMMs run on the matrix units; float32
ones run the same AVX-512 FMAs as pagedllm's tiles, so AMX does not change the float32 choice),
and for both dtypes on AVX2-only CPUs: there the two GEMMs measured alike on their own, but only
"pagedllm" lets the decoder stack (decoder_stack.py) run a step's layers in one call (1.03-2.7x
end to end, emulated AVX2, docs/BENCHMARKS.md), and oneDNN has no bfloat16 GEMM without
AVX-512 or AVX-NE-CONVERT at all. "onednn" elsewhere (bfloat16 on AVX-512 without AVX512_BF16
or with AMX). The environment variable PAGEDLLM_LINEAR=pagedllm|onednn|auto overrides it.

The packed weight replaces the strided one (no second copy), so code that reads `Linear.weight`
after packing gets None. Results differ from `F.linear` only in summation order (about 1e-6
relative in float32; bfloat16 outputs are rounded once from float32 sums either way). Small
weights (under MIN_PACKED_ELEMENTS) are left strided, and for oneDNN row counts are bucketed
(`padded_rows`) so that its primitive cache is not thrashed by the engine's ever-changing step
sizes.

This module imports pagedllm._core lazily: benchmarks/peers/vllm_gemm.py loads it by path in
vLLM's venv, where only the oneDNN backend exists.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Optional

import torch

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
BACKENDS = ("pagedllm", "onednn")
BACKEND_ENV = "PAGEDLLM_LINEAR"

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

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


@dataclasses.dataclass(frozen=True)
class PackedWeight:
    """A linear weight [out_features, in_features] in one backend's layout.

    Attributes:
        backend: "pagedllm" (data: 1-D, `_core.packed_linear_elements` elements) or "onednn"
            (data: an opaque mkldnn tensor).
        data: the packed matrix.
        out_features, in_features: the weight's shape.
    """

    backend: str
    data: torch.Tensor
    out_features: int
    in_features: int

    @property
    def dtype(self) -> torch.dtype:
        """The weight's element type."""
        return self.data.dtype


def worth_packing(weight: torch.Tensor) -> bool:
    """True when `weight` [out, in] is large enough that packing pays off."""
    return weight.numel() >= MIN_PACKED_ELEMENTS


def padded_rows(n: int) -> int:
    """The row count the oneDNN backend multiplies for n rows: n up to EXACT_ROWS, then n
    rounded up to a multiple of 2^(floor(log2 n) - 3)."""
    if n <= EXACT_ROWS:
        return n
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step


@functools.lru_cache(maxsize=None)
def onednn_available(dtype: torch.dtype = torch.float32) -> bool:
    """True when this torch build has oneDNN and the prepacked linear ops, and they run and agree
    with F.linear on a small product of `dtype` (checked once per process and dtype).

    Args:
        dtype: float32 or bfloat16 (oneDNN's bfloat16 path needs AVX-512 BW/VL/DQ or
            AVX-NE-CONVERT: an AVX2-only CPU has none).
    Returns:
        Whether `pack(w, "onednn")` and `linear` work for weights of `dtype` here.
    """
    if dtype not in PACKABLE_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(24, 40, generator=g)
        x = torch.randn(3, 40, generator=g)
        b = torch.randn(24, generator=g)
        y = linear(x.to(dtype), pack(w.to(dtype), "onednn"), b.to(dtype)).float()
    except RuntimeError:
        return False
    want = torch.nn.functional.linear(x.to(dtype), w.to(dtype), b.to(dtype)).float()
    tol = (1e-4, 1e-5) if dtype == torch.float32 else (2e-2, 2e-2)
    return bool(torch.allclose(y, want, rtol=tol[0], atol=tol[1]))


_CORE = None


def _core_module():
    global _CORE
    if _CORE is None:
        from pagedllm import _core  # lazily: see the module docstring
        _CORE = _core
    return _CORE


@functools.lru_cache(maxsize=None)
def pagedllm_vectorised(dtype: torch.dtype) -> bool:
    """True when `_core.linear` has the vector tiles `choose_backend` prefers for dtype on this
    CPU, whatever CPU engine is selected at the moment: AVX-512F for float32 and AVX512_BF16 for
    bfloat16 on AVX-512 CPUs; the AVX2 + FMA tiles, both dtypes, on CPUs without AVX-512.
    (bfloat16 on AVX-512 without AVX512_BF16 would run the AVX2 tiles: False, oneDNN's
    AVX-512 bfloat16 GEMM is not measured against them.)"""
    if dtype not in PACKABLE_DTYPES:
        return False
    try:
        core = _core_module()
    except ImportError:
        return False
    engines = core.cpu_engines()  # compiled in, and this CPU runs them
    if "avx512" not in engines:
        return "avx2" in engines
    if dtype == torch.float32:
        return True
    info = core.build_info()
    return "avx512_bf16" in info["cpu_kernels_compiled"] and "avx512bf16" in info["cpu_features"]


@functools.lru_cache(maxsize=None)
def _has_amx() -> bool:
    try:
        return "amx_bf16" in _core_module().build_info()["cpu_features"]
    except ImportError:
        return False


def _env_choice() -> str:
    """PAGEDLLM_LINEAR as "auto", "pagedllm" or "onednn" (unset or empty: "auto").

    Raises:
        ValueError: any other value.
    """
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto",) + BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={os.environ[BACKEND_ENV]!r}: expected auto, pagedllm "
                         f"or onednn")
    return choice


def choose_backend(dtype: torch.dtype) -> Optional[str]:
    """The backend `pack` uses for weights of dtype by default.

    Args:
        dtype: float32 or bfloat16.
    Returns:
        "pagedllm" where `pagedllm_vectorised(dtype)`, unless dtype is bfloat16 and the CPU
        has AMX (or PAGEDLLM_LINEAR says so), else "onednn" where oneDNN runs dtype here, else
        None (weights stay strided).
    Raises:
        ValueError: PAGEDLLM_LINEAR holds something other than auto, pagedllm or onednn, or
            names a backend this process cannot run.
    """
    choice = _env_choice()
    if choice == "onednn" and not onednn_available(dtype):
        raise ValueError(f"{BACKEND_ENV}=onednn: this torch build or CPU has no prepacked oneDNN "
                         f"linear for {_DTYPE_NAMES.get(dtype, dtype)} weights")
    if choice == "pagedllm":
        _core_module()  # raises ImportError without the extension
        return choice
    if choice == "onednn":
        return choice
    if pagedllm_vectorised(dtype) and not (dtype == torch.bfloat16 and _has_amx()):
        return "pagedllm"
    return "onednn" if onednn_available(dtype) else None


def available(dtype: torch.dtype = torch.float32) -> bool:
    """True when weights of dtype can be packed here (some backend runs)."""
    return choose_backend(dtype) is not None


def pack(weight: torch.Tensor, backend: Optional[str] = None) -> PackedWeight:
    """Reorders a linear weight once for `linear`.

    Args:
        weight: [out_features, in_features] float32 or bfloat16, on the CPU.
        backend: "pagedllm" or "onednn"; None: choose_backend(weight.dtype).
    Returns:
        The same matrix in the backend's layout.
    Raises:
        ValueError: a weight that is not a 2-D CPU float32/bfloat16 tensor, an unknown backend,
            or no backend available.
    """
    if weight.dim() != 2 or weight.device.type != "cpu" or weight.dtype not in PACKABLE_DTYPES:
        raise ValueError(f"weight {list(weight.shape)} {weight.dtype} on {weight.device}: "
                         f"expected a 2-D float32 or bfloat16 CPU tensor")
    backend = backend or choose_backend(weight.dtype)
    if backend not in BACKENDS:
        raise ValueError(f"linear backend {backend!r}: expected one of {BACKENDS} "
                         f"(None: no backend runs here)")
    out_features, in_features = weight.shape
    if backend == "onednn":
        data = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
    else:
        core = _core_module()
        n = core.packed_linear_elements(_DTYPE_NAMES[weight.dtype], out_features, in_features)
        data = torch.empty(n, dtype=weight.dtype)
        core.pack_linear_weight(data, weight.contiguous())
    return PackedWeight(backend, data, out_features, in_features)


def tied_backend(dtype: torch.dtype) -> Optional[str]:
    """The backend that packs a tied embedding / lm_head matrix of dtype, or None (it stays
    strided).

    Only "pagedllm"'s panels can also serve the embedding lookup (`gather_rows`), so a tied
    matrix is packed there whenever `_core.linear` has vector tiles on this CPU (AVX-512 or
    AVX2), whichever backend the other projections use, unless PAGEDLLM_LINEAR=onednn asks for
    oneDNN everywhere. Packing it elsewhere would need a second copy of the embedding; left
    strided, the lm_head runs through F.linear, which re-blocks the whole [vocab, hidden]
    matrix on every call (4-5x slower at decode sizes on a 128k vocabulary).

    Args:
        dtype: the model dtype.
    Returns:
        "pagedllm" or None.
    Raises:
        ValueError: PAGEDLLM_LINEAR holds something other than auto, pagedllm or onednn.
    """
    if dtype not in PACKABLE_DTYPES or _env_choice() == "onednn":
        return None
    try:
        engines = _core_module().cpu_engines()
    except ImportError:
        return None
    return "pagedllm" if {"avx512", "avx2"} & set(engines) else None


def gather_rows(packed: PackedWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the weight [out_features, in_features] that `packed` holds (an embedding
    lookup served from the "pagedllm" layout, so a tied matrix needs no strided copy).

    Args:
        packed: a "pagedllm" PackedWeight.
        ids: [n] integer row indices in [0, out_features).
    Returns:
        [n, in_features], the weight's dtype, bit-identical to weight[ids].
    Raises:
        ValueError: a oneDNN-packed weight (its layout is opaque) or ids that are not 1-D.
        IndexError: an id outside [0, out_features).
    """
    if packed.backend != "pagedllm":
        raise ValueError(f"gather_rows: a {packed.backend!r} packed weight has an opaque layout; "
                         f"expected one packed by 'pagedllm'")
    if ids.dim() != 1:
        raise ValueError(f"gather_rows: ids {list(ids.shape)}: expected a 1-D index vector")
    out = packed.data.new_empty((ids.shape[0], packed.in_features))
    if ids.dtype != torch.int64 or ids.device.type != "cpu" or ids.stride(0) != 1:
        ids = ids.to("cpu", torch.int64).contiguous()
    # [panels, depth, 16, pair] (see linear.h), read back row by row in C++; IndexError (the
    # kernel's) for an id outside [0, out_features), before anything is written
    _core_module().packed_rows(out, packed.data, packed.out_features, ids)
    return out


def linear(x: torch.Tensor, packed: PackedWeight, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """y = x @ W.T + bias with W from `pack`.

    Args:
        x: [n, in_features], the dtype of the packed weight.
        packed: the packed [out_features, in_features] weight.
        bias: [out_features] or None.
    Returns:
        y: [n, out_features] (contiguous).
    Raises:
        ValueError: (backend "pagedllm") shapes or dtypes that do not match the weight.
    """
    n = x.shape[0]
    if packed.backend == "pagedllm":
        if x.dim() != 2 or x.stride(-1) != 1:
            x = x.reshape(n, -1).contiguous()
        y = torch.empty((n, packed.out_features), dtype=x.dtype)
        _core_module().linear(y, x, packed.data, bias)
        return y
    rows = padded_rows(n)
    if rows != n:  # rows are independent: zero rows in, rows dropped out
        padded = x.new_empty((rows, x.shape[1]))
        padded[:n].copy_(x)
        padded[n:].zero_()
        x = padded
    y = torch.ops.mkldnn._linear_pointwise(x, packed.data, bias, "none", [], "")
    return y[:n] if rows != n else y
