"""Allocator and KV-cache-manager costs, against a plain Python free list in the same run.

Measures:
- allocate+free pairs per second of the C++ BlockAllocator (loop in C++), immediate pairs and
  batches of 1024 freed in a scrambled order; the same for a Python list used as a free list;
- one batched decode append (KVCacheManager.append_batch) for 256 running sequences through the
  bindings, and the block-table export that follows it, in microseconds per call.

Usage: python -m benchmarks.bench_allocator [--pairs N]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from benchmarks.common import median_time, write_results
from pagedllm import _core


def python_free_list_pairs_per_s(pairs: int, batch: int) -> float:
    """Allocate+free pairs per second of a Python list used as a LIFO free list."""
    free = list(range(65536))
    rng = random.Random(0)

    def run():
        if batch == 1:
            for _ in range(pairs):
                b = free.pop()
                free.append(b)
            return
        for _ in range(pairs // batch):
            held = [free.pop() for _ in range(batch)]
            rng.shuffle(held)
            for b in held:
                free.append(b)

    return pairs / median_time(run, repeats=5)


def cpp_pairs_per_s(pairs: int, batch: int) -> float:
    """Allocate+free pairs per second of the C++ BlockAllocator (the loop runs in C++)."""
    alloc = _core.BlockAllocator(65536)
    return pairs / median_time(lambda: alloc.churn(pairs, batch), repeats=7)


def batched_append_us(num_seqs: int = 256, steps: int = 200, repeats: int = 5) -> dict:
    """Median microseconds of one decode append_batch (+ block_tables) for num_seqs sequences."""
    results = {"append_batch_us": [], "block_tables_us": []}
    for _ in range(repeats):
        m = _core.KVCacheManager(num_blocks=num_seqs * (steps // 16 + 4), block_size=16)
        ids = np.arange(num_seqs, dtype=np.int64)
        for i in range(num_seqs):
            prompt = np.arange(i * 1000, i * 1000 + 20, dtype=np.int32)  # distinct prompts
            m.allocate(i, prompt)
            m.append(i, prompt)
        ones = np.ones(num_seqs, dtype=np.int32)
        toks = np.full(num_seqs, 7, dtype=np.int32)
        t_append, t_tables = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            res = m.append_batch(ids, ones, toks)
            t1 = time.perf_counter()
            m.block_tables(ids)
            t2 = time.perf_counter()
            assert res is not None
            t_append.append(t1 - t0)
            t_tables.append(t2 - t1)
        results["append_batch_us"].append(float(np.median(t_append)) * 1e6)
        results["block_tables_us"].append(float(np.median(t_tables)) * 1e6)
    return {k: float(np.median(v)) for k, v in results.items()}


def main() -> dict:
    """Runs the measurements, prints them and writes benchmarks/results/allocator.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2_000_000)
    args, _ = parser.parse_known_args()
    out = {}
    for batch in (1, 1024):
        cpp = cpp_pairs_per_s(args.pairs, batch)
        py = python_free_list_pairs_per_s(args.pairs // 4, batch)
        out[f"batch{batch}"] = {"cpp_pairs_per_s": cpp, "python_pairs_per_s": py, "ratio": cpp / py}
        print(f"allocate+free, batch {batch:5d}: C++ {cpp / 1e6:8.1f} M pairs/s | "
              f"Python free list {py / 1e6:6.2f} M pairs/s | ratio {cpp / py:6.1f}x")
    app = batched_append_us()
    out["append_256"] = app
    print(f"append_batch, 256 decoding sequences: {app['append_batch_us']:.1f} us/call; "
          f"block_tables export: {app['block_tables_us']:.1f} us/call")
    path = write_results("allocator", out)
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
