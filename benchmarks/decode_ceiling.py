"""Is the decode kernel bound by memory or by its own arithmetic? Its rate from DRAM against
its rate on data the last-level cache holds, at one thread and at all, in one process.

bench_attention.py reports the decode kernels as a fraction of a sequential read probe. That
fraction says nothing about what holds a kernel back when it falls short: the memory system
(then a kernel reading cached data runs much faster) or the kernel's own instructions (then
it reads cached data about as fast as DRAM). This times, for each K/V storage of
bench_attention (32 query / 8 KV heads of 128, block 16, blocks permuted; fp8 with a bf16
query, as a bf16 model has it):
  cache  4 sequences per thread (at least 8), their context sized so that the K/V fill half
         the last-level cache (64-2048 tokens); read once before timing, so every call reads
         them from there
  dram   the same context, as many sequences as 256 MiB of K/V hold: far past any cache
  l2     the cache case with every block table pointing into the first few blocks (L2_BYTES of
         K/V in all): the same rows read, each from the core's own L2, so the rate is what the
         kernel's instructions allow (what `dram` would reach if the memory kept up)
in interleaved rounds, each round at one thread and at the pool's size, with the read
bandwidth probe (stream_read_sum, 1 GiB) before each round. Reported per storage and thread
count, medians over rounds: K/V bytes per second from DRAM, from cache and from L2, the ratios
of DRAM to the other two (dram_over_cache: near 1 when the arithmetic is the limit, well under
1 when the memory is; dram_over_l2: how much of the instruction-bound rate DRAM reaches), and
the DRAM rate over the probe of the same round.
The cases have the same context and enough sequences that no sequence is split over threads,
so the kernel does the same work per sequence and per thread in all; only where the bytes
come from differs. (With fewer sequences than that, the split and merge of partitions, or
per-sequence costs spread over other lengths, move the cache case more than the memory does.)

Usage: PYTHONPATH=.:python python benchmarks/decode_ceiling.py [--rounds 7]
       [--storages fp32,bf16,fp8] [--probe-gib 1] [--name decode_ceiling]
Writes benchmarks/results/decode_ceiling.json.
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

from benchmarks.bench_attention import (  # noqa: E402
    HEAD_DIM, KV_HEADS, STORAGE, Bandwidth, decode_kernel, make_decode_case)
from benchmarks.common import write_results  # noqa: E402
from pagedllm import _core  # noqa: E402

DRAM_BYTES = 256 << 20  # K/V bytes of the DRAM case
L2_BYTES = 256 << 10  # K/V bytes the l2 case's tables point into (a quarter of a Zen 4 L2)
CALL_BYTES = 2e8  # K/V bytes read per timing (calls repeated up to this)
WHERE = ("dram", "cache", "l2")  # where the K/V rows come from


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache sysfs lists for cpu0 (16 MiB when it lists none)."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or 16 << 20


def token_bytes(storage: str) -> int:
    """K and V bytes of one token (all KV heads) in this storage."""
    elem = torch.empty((), dtype=STORAGE[storage][0]).element_size()  # the cache tensor's
    return 2 * KV_HEADS * HEAD_DIM * elem


def case_shapes(storage: str, llc_bytes: int, threads: int,
                dram_bytes: int = DRAM_BYTES) -> tuple:
    """((sequences, context) of the cache case, (sequences, context) of the DRAM case)."""
    seqs = max(8, 4 * threads)
    ctx = (llc_bytes // 2) // (seqs * token_bytes(storage)) // 16 * 16
    ctx = max(64, min(2048, ctx))
    return (seqs, ctx), (max(seqs, dram_bytes // (ctx * token_bytes(storage))), ctx)


def in_l2(case: dict, storage: str, l2_bytes: int = L2_BYTES) -> dict:
    """The case with its block tables pointing into its first blocks only (l2_bytes of K and V,
    at least one block): the same rows read per call, from a few blocks that stay in L2."""
    block = case["kc"].shape[2]
    blocks = max(1, l2_bytes // (block * token_bytes(storage)))
    return {**case, "tables": case["tables"] % blocks}


def rate(case: dict) -> float:
    """K/V bytes per second of the decode kernel on `case` (calls repeated to CALL_BYTES)."""
    scale = 1.0 / math.sqrt(HEAD_DIM)

    def call():
        _core.paged_attention_decode(case["out"], case["q"], case["kc"], case["vc"],
                                     case["tables"], case["lens"], scale,
                                     case["kv_cache_dtype"])

    call()  # warm: the cache case is read once into the cache, pages touched
    n = max(1, int(CALL_BYTES // case["kv_bytes"]))  # read at call time (tests shrink it)
    t = time.perf_counter()
    for _ in range(n):
        call()
    return n * case["kv_bytes"] / (time.perf_counter() - t)


def measure(storages: list, rounds: int, dram_bytes: int = DRAM_BYTES,
            probe_gib: float = 1.0) -> dict:
    """Times every storage's dram and cache cases at 1 and all threads.

    Args:
        storages: bench_attention.STORAGE keys ("fp32", "bf16", "fp8", ...).
        rounds: interleaved rounds (a probe before each).
        dram_bytes: K/V bytes of the DRAM case.
        probe_gib: size of the sequential read probe.
    Returns:
        {"rows": one dict per (storage, threads), "llc_bytes", "threads", "probe_gbps",
        "engine", "cpu_engines"}.
    """
    all_threads = _core.get_num_threads()
    thread_counts = sorted({1, all_threads})
    llc = last_level_cache_bytes()
    gen = torch.Generator().manual_seed(0)
    cases = {}
    for st in storages:
        cache, dram = case_shapes(st, llc, all_threads, dram_bytes)
        cases[st] = {"dram": make_decode_case(*dram, st, gen, sdpa=False),
                     "cache": make_decode_case(*cache, st, gen, sdpa=False)}
        cases[st]["l2"] = in_l2(cases[st]["cache"], st)
    probe = Bandwidth(probe_gib)
    runs = {(st, th, where): [] for st in storages for th in thread_counts
            for where in WHERE}
    probes = []
    try:
        for _ in range(rounds):
            probes.append(probe.measure())
            for st in storages:
                for th in thread_counts:
                    _core.set_num_threads(th)
                    for where in WHERE:
                        runs[(st, th, where)].append(rate(cases[st][where]))
                    _core.set_num_threads(all_threads)
    finally:
        _core.set_num_threads(all_threads)
    rows = []
    for st in storages:
        for th in thread_counts:
            d, c, l2 = (runs[(st, th, where)] for where in WHERE)
            rows.append({
                "storage": st, "threads": th, "kernel": decode_kernel(st),
                **{f"{where}_case": [cases[st][where]["lens"].numel(),
                                     int(cases[st][where]["lens"][0])]
                   for where in ("dram", "cache")},
                "dram_gbps": statistics.median(d) / 1e9,
                "cache_gbps": statistics.median(c) / 1e9,
                "l2_gbps": statistics.median(l2) / 1e9,
                "dram_over_cache": statistics.median(x / y for x, y in zip(d, c)),
                "dram_over_l2": statistics.median(x / y for x, y in zip(d, l2)),
                "dram_over_probe": statistics.median(x / p for x, p in zip(d, probes)),
                "dram_runs_gbps": [x / 1e9 for x in d],
                "cache_runs_gbps": [x / 1e9 for x in c],
                "l2_runs_gbps": [x / 1e9 for x in l2],
            })
    return {"rows": rows, "llc_bytes": llc, "threads": all_threads,
            "probe_gbps": [p / 1e9 for p in probes], "engine": _core.cpu_kernel(),
            "cpu_engines": _core.cpu_engines()}


def markdown(result: dict) -> str:
    """The rows as a markdown table."""
    lines = ["| K/V | engine | sequences x context (cache / DRAM) | threads | from DRAM | "
             "from cache | from L2 | DRAM / cache | DRAM / L2 | DRAM / probe |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        (cs, cc), (ds, dc) = r["cache_case"], r["dram_case"]
        lines.append(f"| {r['storage']} | {r['kernel']} | {cs} x {cc} / {ds} x {dc} | "
                     f"{r['threads']} | {r['dram_gbps']:.1f} GB/s | "
                     f"{r['cache_gbps']:.1f} GB/s | {r['l2_gbps']:.1f} GB/s | "
                     f"{r['dram_over_cache']:.2f} | {r['dram_over_l2']:.2f} | "
                     f"{r['dram_over_probe']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--storages", default="fp32,bf16,fp8")
    ap.add_argument("--probe-gib", type=float, default=1.0, help="size of the read probe")
    ap.add_argument("--name", default="decode_ceiling", help="results file stem")
    args = ap.parse_args(argv)
    result = measure(args.storages.split(","), args.rounds, DRAM_BYTES, args.probe_gib)
    probes = result["probe_gbps"]
    print(f"last-level cache {result['llc_bytes'] >> 20} MiB; probes "
          f"{min(probes):.1f}-{max(probes):.1f} GB/s; engine {result['engine']}")
    print(markdown(result))
    command = " ".join(["benchmarks/decode_ceiling.py", *(sys.argv[1:] if argv is None else argv)])
    path = write_results(args.name, {"command": command, **result})
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
