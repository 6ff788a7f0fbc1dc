"""Time of one model step (forward + logits of the sampled rows), fp32 against bf16 weights.

Steps measured, for the "tiny" and "small" presets:
  decode16   16 sequences, one new token each, 256 tokens of context each (decode kernel)
  prefill512 one sequence, 512 new tokens (prefill kernel)
The fp32 and bf16 models are timed alternately in one process and the ratio of medians is
reported: the machine is shared, so absolute times are noisy and the ratio is what to quote.

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
            models = {str(dt).removeprefix("torch."): load_model(d, dtype=dt)
                      for dt in (torch.float32, torch.bfloat16)}
        config = next(iter(models.values()))[1]
        caches = {name: PagedKVCache(config, 16 * 16 + 32, BLOCK_SIZE, dtype=m.dtype)
                  for name, (m, _) in models.items()}
        for step_name, (ids, pos, meta), rows in (
                ("decode16", decode_step(16, 256), slice(None)),
                ("prefill512", prefill_step(512), slice(-1, None))):
            times: dict[str, list[float]] = {name: [] for name in models}
            for i in range(args.repeats + 2):
                for name, (model, _) in models.items():
                    t = time.perf_counter()
                    model.compute_logits(model(ids, pos, meta, caches[name])[rows])
                    if i >= 2:  # warm-up
                        times[name].append(time.perf_counter() - t)
            med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
            ratio = med["float32"] / med["bfloat16"]
            print(f"{preset:5s} {step_name:10s} fp32 {med['float32']:8.2f} ms  bf16 "
                  f"{med['bfloat16']:8.2f} ms  fp32/bf16 {ratio:5.2f}", flush=True)
            results.append({"preset": preset, "step": step_name, "fp32_ms": round(med["float32"], 3),
                            "bf16_ms": round(med["bfloat16"], 3), "fp32_over_bf16": round(ratio, 3)})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "model_step", "date": time.strftime("%Y-%m-%d"),
                   "torch_threads": args.threads, "repeats": args.repeats, "results": results}, f,
                  indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
