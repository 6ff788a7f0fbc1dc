"""KV memory: how much of the reserved KV cache holds tokens, and how many sequences fit.

1. Utilization over a run. pagedllm runs the mixed workload (the throughput section's) with an
   ample pool; after every step is scheduled it records the tokens stored and the slots
   reserved (used blocks x block size). For the same running requests at the same step, two
   contiguous schemes are computed: a slot per position up to max_model_len for each request
   (what a static cache reserves) and up to the request's own prompt + max_tokens (an oracle
   that knows every output length). Reported: the mean over steps of stored / reserved, and the
   ratio of the sums over the run.
2. Concurrency under one KV budget. pagedllm runs the same workload with a pool of
   `budget_tokens` slots; the most and the mean number of sequences running per step are
   measured. Contiguous reservation to max_model_len fits budget // max_model_len sequences;
   reservation to prompt + max_tokens is simulated (first come first served, one token per
   step per running request, slots freed when a request ends).

The KV bookkeeping does not depend on the weights, so the "tiny" model is used (fast).

Usage: python -m benchmarks --only memory
Writes benchmarks/results/memory.json.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import List, Optional

from tqdm.auto import tqdm

from benchmarks.common import checkpoint, write_results
from benchmarks.engines import PagedEngine, ample_blocks
from benchmarks.workloads import MIXED, QUICK_MIXED, BenchRequest, describe, mixed_workload


@dataclass
class MemoryConfig:
    """Sizes of the memory runs.

    Attributes:
        model: checkpoint preset.
        mixed: arguments of mixed_workload (the throughput section's by default).
        block_size: pagedllm's block size.
        max_model_len: the length a static cache reserves per sequence.
        budget_tokens: KV slots of the fixed-budget comparison.
        max_num_seqs: pagedllm's cap on running sequences (set high so memory is the limit).
        num_threads: pagedllm threads.
    """

    model: str = "tiny"
    mixed: dict = field(default_factory=lambda: dict(MIXED, n=200))
    block_size: int = 16
    max_model_len: int = 2048
    budget_tokens: int = 16384
    max_num_seqs: int = 512
    num_threads: Optional[int] = None

    @classmethod
    def quick(cls) -> "MemoryConfig":
        return cls(mixed=dict(QUICK_MIXED, n=24),
                   max_model_len=512, budget_tokens=2048)


def utilization_trace(engine: PagedEngine, reqs: List[BenchRequest], max_model_len: int) -> dict:
    """Runs `reqs` and samples the pool every step (see the module docstring, part 1)."""
    sched = engine.llm.engine.scheduler
    samples = []
    t0 = time.monotonic()

    def on_step(stats: dict) -> None:
        running = {s.request.request_id: s.request for s in sched.running}
        own = sum(len(r.prompt_token_ids) + r.params.max_tokens for r in running.values())
        samples.append((time.monotonic() - t0, stats["tokens_stored"], stats["slots_reserved"],
                        len(running), own, len(running) * max_model_len))

    res = engine.generate(reqs, on_step=on_step)
    stored = [s[1] for s in samples]

    def util(col: int) -> dict:
        per_step = [s[1] / s[col] for s in samples if s[col]]
        return {"mean_per_step": round(statistics.fmean(per_step), 4),
                "ratio_of_sums": round(sum(stored) / sum(s[col] for s in samples), 4)}

    return {
        "steps": len(samples), "elapsed_s": round(res.elapsed_s, 3),
        "paged": util(2), "contiguous_own_length": util(4), "contiguous_max_model_len": util(5),
        "mean_tokens_per_running_seq": round(sum(stored) / max(1, sum(s[3] for s in samples)), 1),
        # The trace for the plot: t (s), stored, reserved (paged), running, own, max-len.
        "trace": [[round(s[0], 4), *s[1:]] for s in samples],
    }


def simulate_contiguous(reqs: List[BenchRequest], budget_tokens: int) -> dict:
    """Sequences running per step when each reserves prompt + max_tokens slots up front.

    First come first served; a request is admitted when its whole reservation fits; every
    running request produces one token per step and releases its slots when done.
    """
    queue = list(reqs)
    running: List[List[int]] = []  # [tokens left, reserved]
    used = 0
    counts = []
    while queue or running:
        while queue and used + len(queue[0].prompt_token_ids) + queue[0].max_tokens <= budget_tokens:
            r = queue.pop(0)
            need = len(r.prompt_token_ids) + r.max_tokens
            running.append([r.max_tokens, need])
            used += need
        if not running:
            raise ValueError(f"a request needs more than the {budget_tokens}-slot budget")
        counts.append(len(running))
        for item in running:
            item[0] -= 1
        used -= sum(item[1] for item in running if item[0] == 0)
        running = [item for item in running if item[0] > 0]
    return {"peak_running": max(counts), "mean_running": round(statistics.fmean(counts), 2),
            "steps": len(counts)}


def concurrency_under_budget(ckpt: str, cfg: MemoryConfig, reqs: List[BenchRequest]) -> dict:
    """Part 2 of the module docstring."""
    blocks = cfg.budget_tokens // cfg.block_size
    engine = PagedEngine(ckpt, block_size=cfg.block_size, num_kv_blocks=blocks,
                         max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                         num_threads=cfg.num_threads)
    running = []
    engine.generate(reqs, on_step=lambda s: running.append(s["num_seqs"]))
    stats = engine.llm.kv_cache_stats()
    paged = {"peak_running": max(running), "mean_running": round(statistics.fmean(running), 2),
             "steps": len(running), "preemptions": stats["num_preemptions"],
             "peak_used_blocks": stats["peak_used_blocks"], "num_blocks": blocks}
    static = cfg.budget_tokens // cfg.max_model_len
    own = simulate_contiguous(reqs, cfg.budget_tokens)
    return {
        "budget_tokens": cfg.budget_tokens, "max_model_len": cfg.max_model_len,
        "paged": paged, "contiguous_max_model_len": {"peak_running": static,
                                                     "mean_running": static},
        "contiguous_own_length_simulated": own,
        "ratio_peak_vs_max_model_len": round(paged["peak_running"] / max(1, static), 2),
        "ratio_mean_vs_max_model_len": round(paged["mean_running"] / max(1, static), 2),
        "ratio_peak_vs_own_length": round(paged["peak_running"] / own["peak_running"], 2),
        "ratio_mean_vs_own_length": round(paged["mean_running"] / own["mean_running"], 2),
    }


def run(cfg: Optional[MemoryConfig] = None) -> dict:
    """Runs both parts, writes memory.json and returns its content."""
    from pagedllm.model.checkpoint import random_config

    cfg = cfg or MemoryConfig()
    ckpt = checkpoint(cfg.model)
    reqs = mixed_workload(vocab=random_config(cfg.model).vocab_size, seed=0, **cfg.mixed)
    with tqdm(total=2, desc="memory", unit="run", dynamic_ncols=True) as bar:
        engine = PagedEngine(ckpt, block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
                             num_kv_blocks=max(ample_blocks(reqs, cfg.block_size),
                                               -(-cfg.max_model_len // cfg.block_size)),
                             max_model_len=cfg.max_model_len, num_threads=cfg.num_threads)
        engine.generate(reqs[:4])  # warm-up
        trace = utilization_trace(engine, reqs, cfg.max_model_len)
        del engine
        bar.update(1)
        budget = concurrency_under_budget(ckpt, cfg, reqs)
        bar.update(1)
    out = {"benchmark": "memory", "model": cfg.model, "block_size": cfg.block_size,
           "workload": {**describe(reqs), "generator": cfg.mixed},
           "utilization": trace, "fixed_budget": budget}
    write_results("memory", out)
    return out


if __name__ == "__main__":
    run()
