"""Block size sweep: throughput and KV waste of pagedllm from 8 to 256 tokens per block.

The mixed workload runs at every block size, in interleaved rounds (a different order each
round), twice per round-size: with an ample pool (memory never limits the batch: what the
kernels and the bookkeeping cost) and with a fixed KV budget (slots lost to half-empty blocks
are slots another sequence cannot use: what waste costs). Waste = 1 - tokens stored / slots
reserved, over the run (ratio of the sums over steps). The seed's rule of thumb,
block_size = max(16, 2 ** ceil(log2(mean sequence length / 10))), is evaluated on the workload
(mean of prompt + output tokens) and marked in the results.

Usage: python -m benchmarks --only block_size
Writes benchmarks/results/block_size.json.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from tqdm.auto import tqdm

from benchmarks.common import checkpoint, write_results
from benchmarks.engines import PagedEngine, ample_blocks
from benchmarks.workloads import MIXED, QUICK_MIXED, BenchRequest, describe, mixed_workload


def seed_rule(mean_seq_len: float) -> int:
    """The seed's rule of thumb: max(16, 2 ** ceil(log2(mean_seq_len / 10)))."""
    return max(16, 2 ** math.ceil(math.log2(max(mean_seq_len / 10, 1))))


@dataclass
class BlockSizeConfig:
    """Sizes of the sweep.

    Attributes:
        model: checkpoint preset.
        mixed: arguments of mixed_workload.
        block_sizes: the sweep.
        budget_tokens: KV slots of the fixed-budget runs (None: skip them).
        repeats: interleaved rounds.
        num_threads: pagedllm threads.
    """

    model: str = "tiny"
    mixed: dict = field(default_factory=lambda: dict(MIXED, n=100))
    block_sizes: Tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    budget_tokens: Optional[int] = 16384
    repeats: int = 2
    num_threads: Optional[int] = None

    @classmethod
    def quick(cls) -> "BlockSizeConfig":
        return cls(mixed=dict(QUICK_MIXED, n=16),
                   block_sizes=(8, 16, 64), budget_tokens=2048, repeats=1)


def _one(engine: PagedEngine, reqs: List[BenchRequest]) -> dict:
    stored, reserved, running = [], [], []

    def on_step(s: dict) -> None:
        stored.append(s["tokens_stored"])
        reserved.append(s["slots_reserved"])
        running.append(s["num_seqs"])

    res = engine.generate(reqs, on_step=on_step)
    return {"tokens_per_s": res.tokens_per_s, "waste": 1 - sum(stored) / sum(reserved),
            "mean_running": statistics.fmean(running), "steps": len(running),
            "preemptions": engine.llm.kv_cache_stats()["num_preemptions"]}


def run(cfg: Optional[BlockSizeConfig] = None) -> dict:
    """Runs the sweep, writes block_size.json and returns its content."""
    from pagedllm.model.checkpoint import random_config

    cfg = cfg or BlockSizeConfig()
    ckpt = checkpoint(cfg.model)
    reqs = mixed_workload(vocab=random_config(cfg.model).vocab_size, seed=0, **cfg.mixed)
    desc = describe(reqs)
    max_len = max(len(r.prompt_token_ids) + r.max_tokens for r in reqs)
    pools = {"ample": None}
    if cfg.budget_tokens:
        pools["budget"] = cfg.budget_tokens
    raw: Dict[str, Dict[int, List[dict]]] = {p: {bs: [] for bs in cfg.block_sizes} for p in pools}
    total = cfg.repeats * len(cfg.block_sizes) * len(pools)
    with tqdm(total=total, desc="block size", unit="run", dynamic_ncols=True) as bar:
        for r in range(cfg.repeats):
            k = r % len(cfg.block_sizes)
            for bs in cfg.block_sizes[k:] + cfg.block_sizes[:k]:
                for pool, budget in pools.items():
                    bar.set_postfix_str(f"round {r + 1}, block {bs}, {pool} pool")
                    # One fresh engine per run: the pool size depends on the block size.
                    # "ample": every request's whole sequence fits at once.
                    blocks = budget // bs if budget else ample_blocks(reqs, bs)
                    engine = PagedEngine(ckpt, block_size=bs, num_threads=cfg.num_threads,
                                         num_kv_blocks=blocks, max_model_len=max_len)
                    engine.generate(reqs[:2])  # warm-up
                    raw[pool][bs].append(_one(engine, reqs))
                    del engine
                    bar.update(1)
    sweep = {}
    for pool in pools:
        sweep[pool] = {str(bs): {
            "tokens_per_s": round(statistics.median(x["tokens_per_s"] for x in runs), 2),
            "waste": round(statistics.median(x["waste"] for x in runs), 4),
            "mean_running": round(statistics.median(x["mean_running"] for x in runs), 2),
            "preemptions": int(statistics.median(x["preemptions"] for x in runs)),
            "runs_tokens_per_s": [round(x["tokens_per_s"], 2) for x in runs],
        } for bs, runs in raw[pool].items()}
    mean_len = desc["prompt_len"]["mean"] + desc["output_len"]["mean"]
    best = {pool: max(sweep[pool], key=lambda b: sweep[pool][b]["tokens_per_s"]) for pool in pools}
    out = {"benchmark": "block_size", "model": cfg.model, "workload": {**desc, "generator": cfg.mixed},
           "budget_tokens": cfg.budget_tokens, "repeats": cfg.repeats, "sweep": sweep,
           "mean_seq_len": mean_len, "seed_rule_block_size": seed_rule(mean_len),
           "best_block_size": {p: int(b) for p, b in best.items()}}
    write_results("block_size", out)
    return out


if __name__ == "__main__":
    run()
