"""Time of one model step (forward + logits of the sampled rows), fp32 against bf16 weights.

Steps measured, for the "tiny" and "small" presets:
  decode1/16/64  1, 16 or 64 sequences, one new token each, 256 tokens of context each
  prefill512     one sequence, 512 new tokens (prefill kernel)
Variants: fp32 and bf16 weights, each with plain F.linear and with oneDNN-prepacked weights
(the engine's default, pagedllm.model.packed_linear). All four models are timed alternately in
one process and ratios of medians are reported: the machine is shared, so absolute times are
noisy and the ratios are what to quote.

Usage:  PYTHONPATH=python python benchmarks/bench_model_step.py [--repeats 15] [--threads N]
Writes benchmarks/results/model_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from pagedllm.model import AttentionMetadata, PagedKVCache, load_model, write_random_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK_SIZE = 16


def decode_step(num_seqs: int, context: int):
    """(input_ids, positions, meta) of a decode step over `num_seqs` sequences of `context`."""
    per_seq = -(-context // BLOCK_SIZE)
    tables = torch.arange(num_seqs * per_seq, dtype=torch.int32).view(num_seqs, per_seq)
    last = context - 1
    slots = tables[:, last // BLOCK_SIZE].long() * BLOCK_SIZE + last % BLOCK_SIZE
    meta = AttentionMetadata(slots, tables, torch.full((num_seqs,), context, dtype=torch.int32),
                             torch.arange(num_seqs + 1, dtype=torch.int32), num_seqs)
    return torch.zeros(num_seqs, dtype=torch.int64), torch.full((num_seqs,), last), meta


def prefill_step(n: int):
    """(input_ids, positions, meta) of one sequence prefilling `n` tokens."""
    blocks = -(-n // BLOCK_SIZE)
    meta = AttentionMetadata(torch.arange(n, dtype=torch.int64),
                             torch.arange(blocks, dtype=torch.int32)[None],
                             torch.tensor([n], dtype=torch.int32),
                             torch.tensor([0, n], dtype=torch.int32), 0)
    return torch.zeros(n, dtype=torch.int64), torch.arange(n), meta


VARIANTS = (("fp32", torch.float32, False), ("fp32 packed", torch.float32, True),
            ("bf16", torch.bfloat16, False), ("bf16 packed", torch.bfloat16, True))
STEPS = (("decode1", lambda: decode_step(1, 256), slice(None)),
         ("decode16", lambda: decode_step(16, 256), slice(None)),
         ("decode64", lambda: decode_step(64, 256), slice(None)),
         ("prefill512", lambda: prefill_step(512), slice(-1, None)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default=os.path.join(HERE, "results", "model_step.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for preset in ("tiny", "small"):
        with tempfile.TemporaryDirectory() as d:
            write_random_checkpoint(d, preset)
            models = {name: load_model(d, dtype=dt, prepack=packed)[0]
                      for name, dt, packed in VARIANTS}
            config = load_model(d)[1]
        caches = {name: PagedKVCache(config, 64 * 16 + 32, BLOCK_SIZE, dtype=m.dtype)
                  for name, m in models.items()}
        for step_name, make, rows in STEPS:
            ids, pos, meta = make()
            times: dict[str, list[float]] = {name: [] for name in models}
            for i in range(args.repeats + 2):
                for name, model in models.items():
                    t = time.perf_counter()
                    model.compute_logits(model(ids, pos, meta, caches[name])[rows])
                    if i >= 2:  # warm-up
                        times[name].append(time.perf_counter() - t)
            med = {name: round(statistics.median(ts) * 1e3, 3) for name, ts in times.items()}
            print(f"{preset:5s} {step_name:10s} " + "  ".join(f"{n} {v:8.2f} ms"
                                                              for n, v in med.items()), flush=True)
            results.append({"preset": preset, "step": step_name, "ms": med,
                            "fp32_over_fp32_packed": round(med["fp32"] / med["fp32 packed"], 3),
                            "fp32_over_bf16": round(med["fp32"] / med["bf16"], 3)})
        del models, caches
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "model_step", "date": time.strftime("%Y-%m-%d"),
                   "torch_threads": args.threads, "repeats": args.repeats, "results": results}, f,
                  indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
