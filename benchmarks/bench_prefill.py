"""Prefill attention per CPU engine: the paged kernel against causal SDPA and the GEMM rate.

Whole prompts (causal), K/V in randomly permuted blocks of 16, at the attention shapes of the
"tiny" (8 / 2 heads, head_dim 32) and "small" (16 / 4, head_dim 64) presets and of the kernel
grid (32 / 8, head_dim 128); activations and cache fp32, then bf16 (a bf16 model: with
AVX512_BF16 the avx512 engine's scores use vdpbf16ps). For each case, in interleaved rounds:
every engine this CPU runs (forced in turn), torch's causal scaled_dot_product_attention over
the same data laid out contiguously, and a float32 torch.mm of 2048^3 (the GEMM rate of the
same threads, the practical FMA peak). Reported: GFLOP/s of the causal work (4 * heads *
head_dim * L (L + 1) / 2 per prompt; computed masked work is not counted), that as a fraction of
the GEMM rate, and SDPA time / kernel time. Best of the rounds (the least disturbed run on a
shared machine); medians are kept in the JSON.

Usage: PYTHONPATH=python python benchmarks/bench_prefill.py [--rounds 5] [--cpu-time]
       --cpu-time: one thread, timed in thread CPU time (excludes other jobs' time slices)
Writes benchmarks/results/prefill_engines.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pagedllm import _core

BLOCK = 16
SHAPES = [("tiny", 8, 2, 32), ("small", 16, 4, 64), ("grid", 32, 8, 128)]  # name, heads, kvh, d
CASES = [(1, 2048), (4, 512)]  # batch x prompt
CLOCK = time.perf_counter


def timed(fn) -> float:
    t = CLOCK()
    fn()
    return CLOCK() - t


def gemm_gflops() -> float:
    """One float32 2048^3 torch.mm, GFLOP/s."""
    a = torch.randn(2048, 2048)
    b = torch.randn(2048, 2048)
    a @ b
    return 2 * 2048 ** 3 / timed(lambda: a @ b) / 1e9


def bench_case(shape, batch: int, prompt: int, dtype, rounds: int, gen) -> dict:
    name, heads, kvh, hd = shape
    blocks = batch * prompt // BLOCK
    kc = torch.randn((blocks, kvh, BLOCK, hd), generator=gen).to(dtype)
    vc = torch.randn((blocks, kvh, BLOCK, hd), generator=gen).to(dtype)
    tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(batch, -1)
    lens = torch.full((batch,), prompt, dtype=torch.int32)
    cu = torch.arange(0, batch + 1, dtype=torch.int32) * prompt
    q = torch.randn((batch * prompt, heads, hd), generator=gen).to(dtype)  # [tokens, heads, d]
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(hd)

    def contiguous(cache):  # [blocks, kvh, BLOCK, d] -> [batch, kvh, prompt, d]
        c = cache[tables.long()].permute(0, 2, 1, 3, 4)
        return c.reshape(batch, kvh, prompt, hd).contiguous()

    k_s, v_s = contiguous(kc), contiguous(vc)
    q_s = q.reshape(batch, prompt, heads, hd).transpose(1, 2).contiguous()
    engines = _core.cpu_engines()

    def kernel(engine):
        _core.set_cpu_engine(engine)
        return timed(lambda: _core.paged_attention_prefill(out, q, kc, vc, tables, cu, lens,
                                                           scale))

    def sdpa():
        return timed(lambda: F.scaled_dot_product_attention(q_s, k_s, v_s, is_causal=True,
                                                            scale=scale, enable_gqa=True))

    for e in engines:
        kernel(e)
    sdpa()
    times = {e: [] for e in engines} | {"sdpa": [], "gemm_gflops": []}
    try:
        for _ in range(rounds):  # interleaved: every variant sees the same disturbances
            for e in engines:
                times[e].append(kernel(e))
            times["sdpa"].append(sdpa())
            times["gemm_gflops"].append(gemm_gflops())
    finally:
        _core.set_cpu_engine("auto")
    flop = 4 * heads * hd * batch * prompt * (prompt + 1) / 2
    gemm = max(times["gemm_gflops"])
    sdpa_s = min(times["sdpa"])
    row = dict(shape=name, heads=heads, kv_heads=kvh, head_dim=hd, batch=batch, prompt=prompt,
               dtype=str(dtype).removeprefix("torch."), gemm_gflops=gemm,
               sdpa_ms=sdpa_s * 1e3, sdpa_gflops=flop / sdpa_s / 1e9,
               medians_ms={k: statistics.median(v) * 1e3 for k, v in times.items()
                           if k != "gemm_gflops"}, engines={})
    for e in engines:
        t = min(times[e])
        row["engines"][e] = dict(ms=t * 1e3, gflops=flop / t / 1e9,
                                 frac_of_gemm=flop / t / 1e9 / gemm, speedup_vs_sdpa=sdpa_s / t)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread for the kernels and torch, timed in thread CPU time")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                         "prefill_engines.json"))
    args = ap.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.thread_time
        _core.set_num_threads(1)
    torch.set_num_threads(_core.get_num_threads())
    gen = torch.Generator().manual_seed(0)
    load0 = os.getloadavg()
    print(f"threads={_core.get_num_threads()} engines={_core.cpu_engines()} "
          f"features={_core.build_info()['cpu_features']} load={load0}")
    rows = []
    for dtype in [torch.float32, torch.bfloat16]:
        for shape in SHAPES:
            for batch, prompt in CASES:
                r = bench_case(shape, batch, prompt, dtype, args.rounds, gen)
                rows.append(r)
                cells = "  ".join(f"{e} {v['gflops']:5.1f} ({100 * v['frac_of_gemm']:3.0f}%, "
                                  f"{v['speedup_vs_sdpa']:.2f}x sdpa)"
                                  for e, v in r["engines"].items())
                print(f"{r['dtype']:>8} {shape[0]:>5} d{shape[3]:<3} {batch}x{prompt:<5} "
                      f"gemm {r['gemm_gflops']:5.1f} sdpa {r['sdpa_gflops']:5.1f} | {cells}",
                      flush=True)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                threads=_core.get_num_threads(),
                clock="thread_time" if args.cpu_time else "perf_counter",
                cpu_features=_core.build_info()["cpu_features"], torch=torch.__version__,
                rounds=args.rounds, load_avg_start=load0, load_avg_end=os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(meta=meta, prefill=rows), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
