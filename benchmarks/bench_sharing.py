"""KV sharing: parallel sampling and beam search (copy-on-write forks), and shared prefixes.

1. Parallel sampling (n = 2, 4, 6) and beam search (width 2, 4, 6) on requests of the mixed
   workload's shape. After every step is scheduled, the pool's physical blocks in use are
   compared with the blocks the same sequences would hold without sharing (each sequence its
   own copy: the sum of ceil(tokens / block_size) over the running sequences). Memory saved =
   1 - physical / unshared, over the whole run (ratio of the sums over steps, as the
   PagedAttention paper reports it) and at the peak. Parallel sampling also runs "for real"
   without sharing: every request submitted n times with n = 1 (tokens/s and peak blocks).
2. Shared system prompt. Requests that all begin with the same long prompt, with prefix
   caching on (cold cache at the start of each run) and off: throughput, time to first token
   (from the start of the run: every request arrives at once) and peak KV blocks.

Usage: python -m benchmarks --only sharing
Writes benchmarks/results/sharing.json.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from tqdm.auto import tqdm

from benchmarks.common import checkpoint, write_results
from benchmarks.engines import PagedEngine, RunResult, ample_blocks
from benchmarks.workloads import (MIXED, QUICK_MIXED, BenchRequest,
                                  describe, mixed_workload, shared_prefix_workload)


@dataclass
class SharingConfig:
    """Sizes of the sharing runs.

    Attributes:
        fork_model: preset of the parallel-sampling and beam-search runs.
        fork_workload: arguments of mixed_workload for those runs.
        widths: n for parallel sampling and beam width for beam search.
        prefix_model: preset of the shared-prefix runs.
        prefix: arguments of shared_prefix_workload.
        repeats: rounds of the shared-prefix pair (on, off), interleaved.
        block_size: pagedllm's block size.
        num_threads: pagedllm threads.
    """

    fork_model: str = "tiny"
    fork_workload: dict = field(default_factory=lambda: dict(MIXED, n=16))
    widths: Tuple[int, ...] = (2, 4, 6)
    prefix_model: str = "small"
    prefix: dict = field(default_factory=lambda: dict(
        n=32, prefix_len=512, suffix_mean=32, output_len=32))
    repeats: int = 2
    block_size: int = 16
    num_threads: Optional[int] = None

    @classmethod
    def quick(cls) -> "SharingConfig":
        return cls(fork_workload=dict(QUICK_MIXED, n=6),
                   widths=(2,), prefix_model="tiny",
                   prefix=dict(n=8, prefix_len=64, suffix_mean=8, output_len=8), repeats=1)


class BlockCounter:
    """on_step hook: physical blocks in use against the unshared count, every step."""

    def __init__(self, engine: PagedEngine):
        self.engine = engine.llm.engine
        self.bs = engine.config.block_size
        self.physical: List[int] = []
        self.unshared: List[int] = []

    def __call__(self, stats: dict) -> None:
        kv = self.engine.kv_manager
        self.physical.append(stats["used_blocks"])
        self.unshared.append(sum(math.ceil(kv.num_tokens(s.seq_id) / self.bs)
                                 for s in self.engine.scheduler.running))

    def summary(self) -> dict:
        phys, logical = sum(self.physical), sum(self.unshared)
        return {"steps": len(self.physical),
                "saved_over_run": round(1 - phys / logical, 4),
                "saved_at_peak": round(1 - max(self.physical) / max(self.unshared), 4),
                "peak_blocks_shared": max(self.physical),
                "peak_blocks_unshared": max(self.unshared)}


def fork_sharing(engine: PagedEngine, reqs: List[BenchRequest], widths, bar) -> dict:
    """Part 1 of the module docstring."""
    out: Dict[str, dict] = {"parallel_sampling": {}, "beam_search": {}}
    for n in widths:
        bar.set_postfix_str(f"parallel sampling n={n}")
        counter = BlockCounter(engine)
        shared = engine.generate(reqs, on_step=counter, n=n, temperature=1.0, seed=0)
        dup = [r for r in reqs for _ in range(n)]
        peak = []
        alone = engine.generate(dup, on_step=lambda s: peak.append(s["used_blocks"]),
                                temperature=1.0, seed=0)
        out["parallel_sampling"][str(n)] = {
            **counter.summary(), "tokens_per_s_shared": round(shared.tokens_per_s, 1),
            "tokens_per_s_separate_requests": round(alone.tokens_per_s, 1),
            "peak_blocks_separate_requests": max(peak)}
        bar.update(1)
    for w in widths:
        bar.set_postfix_str(f"beam search width {w}")
        counter = BlockCounter(engine)
        res = engine.beam_search(reqs, w, on_step=counter)
        out["beam_search"][str(w)] = {**counter.summary(),
                                      "tokens_per_s": round(res.tokens_per_s, 1)}
        bar.update(1)
    return out


def shared_prefix(ckpt: str, cfg: SharingConfig, reqs: List[BenchRequest], bar) -> dict:
    """Part 2 of the module docstring."""
    blocks = ample_blocks(reqs, cfg.block_size)
    engines = {mode: PagedEngine(ckpt, block_size=cfg.block_size, num_kv_blocks=blocks,
                                 enable_prefix_caching=mode == "on", num_threads=cfg.num_threads)
               for mode in ("on", "off")}
    warm = reqs[:2]
    for e in engines.values():
        e.generate(warm)
    runs: Dict[str, List[RunResult]] = {"on": [], "off": []}
    peaks: Dict[str, List[int]] = {"on": [], "off": []}
    hits = []
    for r in range(cfg.repeats):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            bar.set_postfix_str(f"shared prefix, caching {mode}")
            e = engines[mode]
            e.reset_prefix_cache()
            before = e.llm.kv_cache_stats()
            peak = []
            runs[mode].append(e.generate(reqs, on_step=lambda s: peak.append(s["used_blocks"])))
            peaks[mode].append(max(peak))
            if mode == "on":
                after = e.llm.kv_cache_stats()
                hits.append((after["prefix_cache_hits"] - before["prefix_cache_hits"])
                            / max(1, after["prefix_cache_queries"] - before["prefix_cache_queries"]))
            bar.update(1)

    def med(mode, key):
        return statistics.median(getattr(x, key) for x in runs[mode])

    def med_ttft(mode, f):
        return statistics.median(f(x.ttft_s) for x in runs[mode])

    out = {mode: {"tokens_per_s": round(med(mode, "tokens_per_s"), 2),
                  "elapsed_s": round(med(mode, "elapsed_s"), 3),
                  "ttft_mean_s": round(med_ttft(mode, statistics.fmean), 4),
                  "ttft_median_s": round(med_ttft(mode, statistics.median), 4),
                  "peak_used_blocks": min(peaks[mode]),
                  "runs": [x.summary() for x in runs[mode]]} for mode in runs}
    out["prefix_hit_rate"] = round(statistics.median(hits), 4)
    out["throughput_ratio_on_off"] = round(out["on"]["tokens_per_s"] / out["off"]["tokens_per_s"], 3)
    out["ttft_mean_ratio_off_on"] = round(out["off"]["ttft_mean_s"] / out["on"]["ttft_mean_s"], 3)
    out["same_tokens"] = runs["on"][0].first_tokens == runs["off"][0].first_tokens
    return out


def run(cfg: Optional[SharingConfig] = None) -> dict:
    """Runs both parts, writes sharing.json and returns its content."""
    from pagedllm.model.checkpoint import random_config

    cfg = cfg or SharingConfig()
    fork_reqs = mixed_workload(vocab=random_config(cfg.fork_model).vocab_size, seed=1,
                               **cfg.fork_workload)
    prefix_reqs = shared_prefix_workload(vocab=random_config(cfg.prefix_model).vocab_size,
                                         seed=2, **cfg.prefix)
    total = 2 * len(cfg.widths) + 2 * cfg.repeats
    with tqdm(total=total, desc="sharing", unit="run", dynamic_ncols=True) as bar:
        engine = PagedEngine(checkpoint(cfg.fork_model), block_size=cfg.block_size,
                             num_kv_blocks=ample_blocks(fork_reqs, cfg.block_size, max(cfg.widths)),
                             num_threads=cfg.num_threads)
        engine.generate(fork_reqs[:2])  # warm-up
        forks = fork_sharing(engine, fork_reqs, cfg.widths, bar)
        del engine
        prefix = shared_prefix(checkpoint(cfg.prefix_model), cfg, prefix_reqs, bar)
    out = {"benchmark": "sharing", "block_size": cfg.block_size,
           "fork_model": cfg.fork_model,
           "fork_workload": {**describe(fork_reqs), "generator": cfg.fork_workload},
           **forks,
           "prefix_model": cfg.prefix_model,
           "prefix_workload": {**describe(prefix_reqs), "generator": cfg.prefix},
           "shared_prefix": prefix}
    write_results("sharing", out)
    return out


if __name__ == "__main__":
    run()
