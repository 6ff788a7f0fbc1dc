"""A bf16 model's attention kernels under "auto" against the exact engine, in one process.

Under "auto", a bf16 query (a bf16 model's) on a bf16 or fp8 cache rounds its probabilities to
bf16 for p.v where the CPU has AVX512_BF16, as the model's own attention does: decode runs on
the avx512_bf16 engine's dot products, and the avx512 engine's prefill tile multiplies the
probabilities by V with vdpbf16ps (docs/ARCHITECTURE.md). This times both kernels under
"auto" and under the exact engine named ("avx512", the float32 p.v), alternating per round on
the same data, and reports the median per-round speed-up (exact time / auto time) with the
median times: prefill as causal attention FLOPs per second (whole prompts), decode as K/V bytes
per second. Shapes: the presets' heads ("tiny" 8/2 x 32, "small" 16/4 x 64, "1b" 32/8 x 64)
and 32/8 x 128; block 16, blocks permuted.

Usage: PYTHONPATH=python python benchmarks/bf16_probs_ab.py [--rounds 7] [--kv bf16|fp8]
Writes benchmarks/results/bf16_probs_ab.json (another --kv: bf16_probs_ab_<kv>.json).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_results  # noqa: E402
from pagedllm import _core, threads  # noqa: E402

BLOCK = 16
# (name, heads, kv heads, head_dim)
SHAPES = [("tiny", 8, 2, 32), ("small", 16, 4, 64), ("1b", 32, 8, 64), ("hd128", 32, 8, 128)]
PREFILL = (2, 2048)   # sequences x whole-prompt tokens
DECODE = (16, 2048)   # sequences x context tokens


def paged(gen, seqs: int, tokens: int, kvh: int, hd: int, kv: str):
    """Key and value caches of seqs x tokens (bf16, or fp8 e4m3 bytes) and a permuted table."""
    blocks = seqs * tokens // BLOCK
    caches = []
    for _ in range(2):
        c = torch.randn((blocks, kvh, BLOCK, hd), generator=gen)
        caches.append(c.to(torch.float8_e4m3fn).view(torch.uint8) if kv == "fp8"
                      else c.to(torch.bfloat16))
    tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(seqs, -1)
    return caches[0], caches[1], tables


def prefill_call(gen, heads: int, kvh: int, hd: int, kv: str):
    seqs, tokens = PREFILL
    kc, vc, tables = paged(gen, seqs, tokens, kvh, hd, kv)
    lens = torch.full((seqs,), tokens, dtype=torch.int32)
    cu = torch.arange(0, seqs + 1, dtype=torch.int32) * tokens
    q = torch.randn((seqs * tokens, heads, hd), generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    kv_dtype = "fp8" if kv == "fp8" else "auto"
    flops = 4 * seqs * heads * hd * tokens * (tokens + 1) / 2  # q.k and p.v, causal

    def call():
        _core.paged_attention_prefill(out, q, kc, vc, tables, cu, lens, 1 / math.sqrt(hd),
                                      kv_dtype)
    return call, flops


def decode_call(gen, heads: int, kvh: int, hd: int, kv: str):
    seqs, tokens = DECODE
    kc, vc, tables = paged(gen, seqs, tokens, kvh, hd, kv)
    lens = torch.full((seqs,), tokens, dtype=torch.int32)
    q = torch.randn((seqs, heads, hd), generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    kv_dtype = "fp8" if kv == "fp8" else "auto"

    def call():
        _core.paged_attention_decode(out, q, kc, vc, tables, lens, 1 / math.sqrt(hd), kv_dtype)
    return call, 2 * seqs * tokens * kvh * hd * kc.element_size()


def ab(call, rounds: int) -> dict:
    """Per round: one warm call and one timed call under each engine, alternating."""
    times = {"avx512": [], "auto": []}
    for _ in range(rounds):
        for engine, ts in times.items():
            _core.set_cpu_engine(engine)
            call()
            t = time.perf_counter()
            call()
            ts.append(time.perf_counter() - t)
    _core.set_cpu_engine("auto")
    ratios = [a / b for a, b in zip(times["avx512"], times["auto"])]
    return {"exact_ms": float(f"{statistics.median(times['avx512']) * 1e3:.4g}"),
            "auto_ms": float(f"{statistics.median(times['auto']) * 1e3:.4g}"),
            "speedup": round(statistics.median(ratios), 3),
            "speedup_rounds": [round(r, 3) for r in ratios]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--kv", choices=("bf16", "fp8"), default="bf16")
    args = ap.parse_args()
    n = threads.set_num_threads(None)
    features = _core.build_info()["cpu_features"]
    if "avx512bf16" not in features or "avx512" not in _core.cpu_engines():
        raise SystemExit("this CPU has no AVX512_BF16 (or no avx512 engine): auto is exact here")
    gen = torch.Generator().manual_seed(0)
    rows = []
    kernels = (("prefill", prefill_call, PREFILL, "gflops", "GFLOP/s"),
               ("decode", decode_call, DECODE, "gbps", "GB/s"))
    for name, heads, kvh, hd in SHAPES:
        for kernel, build, size, unit, label in kernels:
            call, work = build(gen, heads, kvh, hd, args.kv)  # work: FLOPs or K/V bytes
            r = ab(call, args.rounds)
            exact, auto = (float(f"{work / r[k] / 1e6:.4g}") for k in ("exact_ms", "auto_ms"))
            r.update({"kernel": kernel, "shape": name, "heads": heads, "kv_heads": kvh,
                      "head_dim": hd, "seqs_x_tokens": list(size), f"exact_{unit}": exact,
                      f"auto_{unit}": auto})
            rows.append(r)
            print(f"{kernel:7s} {name:6s} {heads}/{kvh} x {hd}: exact {exact} {label}, "
                  f"auto {auto} {label}, {r['speedup']}x", flush=True)
            del call
    stem = "bf16_probs_ab" if args.kv == "bf16" else f"bf16_probs_ab_{args.kv}"
    path = write_results(stem, {"threads": n, "kv": args.kv, "rounds": args.rounds,
                                "cpu_features": features, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
