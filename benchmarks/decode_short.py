"""Decode attention of many short sequences, K/V from DRAM: the step of a busy server.

decode_ceiling.py reads a few long contexts. A serving engine's decode steps are more often
many sequences of a few hundred tokens each, where every sequence's reads start at a new place:
what the kernel does between sequences (its prefetch across them) matters as much as its rate
within one. For each model preset's attention shape (query heads / KV heads / head_dim of
"tiny", "small" and "1b"), `batch` sequences of `context` tokens in permuted blocks of 16, fp32
K/V (as an fp32 model has them):
  dram  one call on each of several such pools in turn, the pools together POOLS_OVER_LLC times
        the last-level cache, so every call reads its K/V from DRAM (as in an engine, where the
        other layers and the GEMMs evict them between calls)
  warm  every call on the same pool (its first sequences only, where all of them would fill
        more than half the cache): the kernel's rate when memory is not in the way
at one thread and at the pool's size, in interleaved rounds, with the read probe
(stream_read_sum) before each round. Reported per shape and thread count, medians over rounds:
microseconds per call, K/V bytes per second (dram and warm), their ratio, and dram over the
round's probe.

Usage: PYTHONPATH=.:python python benchmarks/decode_short.py [--rounds 5] [--batch 64]
       [--context 160] [--shapes tiny,small,1b] [--probe-gib 1] [--name decode_short]
Writes benchmarks/results/decode_short.json.
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

from benchmarks.bench_attention import Bandwidth  # noqa: E402
from benchmarks.common import write_results  # noqa: E402
from benchmarks.decode_ceiling import last_level_cache_bytes  # noqa: E402
from pagedllm import _core  # noqa: E402
from pagedllm.model.checkpoint import random_config  # noqa: E402

BLOCK = 16
POOLS_OVER_LLC = 2.0  # the dram case's pools, together, over the last-level cache
CALLS = 200  # kernel calls per timing (tests shrink it)


def shape_of(preset: str) -> tuple:
    """(query heads, KV heads, head_dim) of a model preset."""
    c = random_config(preset)
    return c.num_attention_heads, c.num_key_value_heads, c.head_dim


def make_pool(heads: int, kv_heads: int, head_dim: int, batch: int, context: int,
              gen: torch.Generator) -> dict:
    """One pool of fp32 K/V for `batch` sequences of `context` tokens (blocks permuted), with
    its tables, lengths, query and output."""
    per_seq = (context + BLOCK - 1) // BLOCK
    blocks = batch * per_seq
    kc = torch.randn((blocks, kv_heads, BLOCK, head_dim), generator=gen)
    vc = torch.randn((blocks, kv_heads, BLOCK, head_dim), generator=gen)
    tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(batch, per_seq)
    q = torch.randn((batch, heads, head_dim), generator=gen)
    return {"kc": kc, "vc": vc, "tables": tables, "q": q, "out": torch.empty_like(q),
            "lens": torch.full((batch,), context, dtype=torch.int32),
            "kv_bytes": 2 * batch * context * kv_heads * head_dim * 4}


def warm_pool(pool: dict, llc_bytes: int) -> dict:
    """`pool` cut to its first sequences that fill at most half of `llc_bytes` (one at least)."""
    batch = pool["lens"].numel()
    keep = max(1, min(batch, int(llc_bytes // 2 // (pool["kv_bytes"] // batch))))
    if keep == batch:
        return pool
    return {**pool, "tables": pool["tables"][:keep], "lens": pool["lens"][:keep],
            "q": pool["q"][:keep], "out": pool["out"][:keep],
            "kv_bytes": pool["kv_bytes"] // batch * keep}


def per_call_s(pools: list, head_dim: int) -> float:
    """Seconds per decode call, the calls cycling through `pools` (CALLS calls)."""
    scale = 1.0 / math.sqrt(head_dim)

    def call(p):
        _core.paged_attention_decode(p["out"], p["q"], p["kc"], p["vc"], p["tables"], p["lens"],
                                     scale, "auto")

    for p in pools:  # pages touched, nothing timed cold by accident
        call(p)
    t = time.perf_counter()
    for i in range(CALLS):
        call(pools[i % len(pools)])
    return (time.perf_counter() - t) / CALLS


def measure(shapes: list, batch: int, context: int, rounds: int, probe_gib: float,
            llc_bytes: int) -> list:
    """Rows of per-shape, per-thread-count medians (see the module docstring)."""
    gen = torch.Generator().manual_seed(0)
    probe = Bandwidth(probe_gib)
    saved = _core.get_num_threads()
    counts = sorted({1, saved})
    rows = []
    try:
        for preset in shapes:
            heads, kv_heads, hd = shape_of(preset)
            first = make_pool(heads, kv_heads, hd, batch, context, gen)
            n_pools = max(2, math.ceil(POOLS_OVER_LLC * llc_bytes / first["kv_bytes"]))
            pools = [first] + [make_pool(heads, kv_heads, hd, batch, context, gen)
                               for _ in range(n_pools - 1)]
            warm = warm_pool(first, llc_bytes)
            runs = {t: {"dram": [], "warm": [], "probe": []} for t in counts}
            for _ in range(rounds):
                for t in counts:
                    _core.set_num_threads(t)
                    runs[t]["probe"].append(probe.measure())
                    runs[t]["dram"].append(per_call_s(pools, hd))
                    runs[t]["warm"].append(per_call_s([warm], hd))
            for t in counts:
                r = runs[t]
                kv, kv_warm = first["kv_bytes"], warm["kv_bytes"]
                rows.append({
                    "shape": preset, "heads": heads, "kv_heads": kv_heads, "head_dim": hd,
                    "batch": batch, "context": context, "threads": t, "pools": n_pools,
                    "kv_bytes_per_call": kv, "warm_batch": warm["lens"].numel(),
                    "dram_us": statistics.median(r["dram"]) * 1e6,
                    "warm_us": statistics.median(r["warm"]) * 1e6,
                    "dram_gbps": kv / statistics.median(r["dram"]) / 1e9,
                    "warm_gbps": kv_warm / statistics.median(r["warm"]) / 1e9,
                    "dram_over_warm": statistics.median(
                        (kv / d) / (kv_warm / w) for d, w in zip(r["dram"], r["warm"])),
                    "dram_over_probe": statistics.median(kv / d / p for d, p in zip(r["dram"], r["probe"])),
                    "probe_gbps": [p / 1e9 for p in r["probe"]],
                    "dram_runs_us": [d * 1e6 for d in r["dram"]],
                    "warm_runs_us": [w * 1e6 for w in r["warm"]],
                })
    finally:
        _core.set_num_threads(saved)
    return rows


def markdown(rows: list) -> str:
    """The rows as a markdown table."""
    out = ["| shape (heads / KV / head_dim) | threads | from DRAM | warm (sequences) | "
           "DRAM over warm | DRAM over probe |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['shape']} {r['heads']}/{r['kv_heads']}/{r['head_dim']}, "
                   f"{r['batch']} x {r['context']} | {r['threads']} | {r['dram_us']:.0f} us, "
                   f"{r['dram_gbps']:.1f} GB/s | {r['warm_gbps']:.1f} GB/s ({r['warm_batch']})"
                   f" | {r['dram_over_warm']:.2f} | {r['dram_over_probe']:.2f} |")
    return "\n".join(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--shapes", default="tiny,small,1b")
    ap.add_argument("--probe-gib", type=float, default=1.0, help="size of the read probe")
    ap.add_argument("--name", default="decode_short", help="results file stem")
    args = ap.parse_args(argv)
    rows = measure(args.shapes.split(","), args.batch, args.context, args.rounds,
                   args.probe_gib, last_level_cache_bytes())
    table = markdown(rows)
    print(f"CPU engine {_core.cpu_kernel()}, last-level cache {last_level_cache_bytes() >> 20} MiB")
    print(table)
    result = {"benchmark": "decode_short", "engine": _core.cpu_kernel(), "rows": rows,
              "command": "benchmarks/decode_short.py " + " ".join(argv if argv is not None
                                                                  else sys.argv[1:])}
    write_results(args.name, result)
    return result


if __name__ == "__main__":
    main()
