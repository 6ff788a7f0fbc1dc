"""Decode attention on a KV cache on 4 KiB pages against the same cache on 2 MiB pages.

One process holds two copies of each case's paged K/V (32 query / 8 KV heads, head_dim 128,
block 16, blocks in random order): one from torch (4 KiB pages, the engine's default) and one
from `pagedllm.model.huge_pages.zeros` (what the KV pool gets with PAGEDLLM_HUGE_PAGES=1). Each
round flushes the caches with a 256 MiB read and times one decode call on each copy, the order
alternating, so both see the same machine state; reported per case: K/V bytes per second of
each (medians), and the median over rounds of the per-round time ratio (4 KiB / 2 MiB).

Usage: PYTHONPATH=.:python python -m benchmarks.huge_pages_ab [--rounds 40] [--threads 2]
Prints a table and writes benchmarks/results/huge_pages_ab.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.bench_attention import on_pool_pages
from benchmarks.common import write_results
from pagedllm import _core, threads
from pagedllm.model import huge_pages

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
CASES = ((16, 2048), (1, 8192), (64, 2048))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def one_case(dtype: torch.dtype, batch: int, ctx: int, rounds: int, gen: torch.Generator,
             flush: torch.Tensor) -> dict:
    """Times one case on both copies; returns its figures."""
    blocks = batch * ctx // BLOCK
    shape = (blocks, KV_HEADS, BLOCK, HEAD_DIM)
    small = [torch.randn(shape, generator=gen).to(dtype) for _ in range(2)]  # K, V
    huge = [on_pool_pages(s) for s in small]
    tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(batch, -1)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    q = torch.randn((batch, HEADS, HEAD_DIM), generator=gen)
    out = torch.empty_like(q)

    def run(kv) -> float:
        _core.stream_read_sum(flush)
        t = time.perf_counter()
        _core.paged_attention_decode(out, q, kv[0], kv[1], tables, lens, HEAD_DIM ** -0.5,
                                     "auto", 1.0, 1.0)
        return time.perf_counter() - t

    run(small), run(huge)
    t_small, t_huge = [], []
    for r in range(rounds):
        if r % 2:
            t_small.append(run(small))
            t_huge.append(run(huge))
        else:
            t_huge.append(run(huge))
            t_small.append(run(small))
    kv_bytes = 2 * small[0].numel() * small[0].element_size()
    return {"batch": batch, "context": ctx, "kv_bytes": kv_bytes,
            "gbps_4k": kv_bytes / statistics.median(t_small) / 1e9,
            "gbps_2m": kv_bytes / statistics.median(t_huge) / 1e9,
            "time_ratio_4k_over_2m": statistics.median(
                a / b for a, b in zip(t_small, t_huge))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not huge_pages.available():
        raise SystemExit(f"no huge pages here (THP mode {huge_pages.thp_mode()})")
    os.environ[huge_pages.ENV] = "1"  # the 2 MiB copies (the engine's default is 4 KiB pages)
    threads.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    flush = torch.ones(64 << 20)
    rows = []
    print(f"{'K/V':>5} {'case':>9} {'4 KiB GB/s':>11} {'2 MiB GB/s':>11} {'time 4k/2M':>11}")
    for name, dtype in DTYPES.items():
        for batch, ctx in CASES:
            row = dict(one_case(dtype, batch, ctx, args.rounds, gen, flush), storage=name)
            rows.append(row)
            print(f"{name:>5} {batch:>3} x {ctx:<4} {row['gbps_4k']:11.1f} {row['gbps_2m']:11.1f} "
                  f"{row['time_ratio_4k_over_2m']:10.3f}x", flush=True)
    meta = {"cpu_engine": _core.cpu_kernel(), "threads": args.threads, "rounds": args.rounds,
            "thp_mode": huge_pages.thp_mode()}  # write_results adds the machine, date and load
    path = write_results("huge_pages_ab", {"meta": meta, "cases": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
