"""Swap vs recompute preemption on a memory-pressure workload, across block sizes.

One seeded mixed workload (log-normal prompt and output lengths) runs, all requests added at
once, on a KV pool far smaller than its demand (`pool_tokens` slots, the same token capacity at
every block size: num_kv_blocks = pool_tokens // block_size), so the scheduler preempts often.
Each (model, block size) runs with preemption_mode="recompute" and "swap" (a host pool large
enough for every sequence), the two modes back to back in alternating order, `repeats` rounds;
the swap/recompute ratios are taken per round and their median reported. Per run: output
tokens/s, P50/P99 end-to-end request latency (RequestOutput.metrics finish - arrival), the
preemption / swap-out / swap-in counts, and the wall time of the worker's transfers before the
forward (swap-outs and swap-ins; on the CPU a memcpy in the same RAM).

Reference: the PagedAttention paper (Kwon et al., SOSP 2023) §7.3 finds swapping worse at
small block sizes (many small PCIe transfers) and recompute within 20% of swap there.

Usage: python -m benchmarks --only preemption [--quick]
Writes benchmarks/results/preemption.json.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from tqdm.auto import tqdm

from benchmarks.common import checkpoint, write_results
from benchmarks.workloads import BenchRequest, describe, mixed_workload

MODES = ("recompute", "swap")
# Lengths of the pressure workload: the mixed workload's shape, clipped so that the longest
# sequence (prompt + output) fits the small pool on its own.
PRESSURE = dict(prompt_mean=128, prompt_sigma=0.8, output_mean=64, output_sigma=0.8,
                max_prompt=512, max_output=256)


@dataclass
class PreemptionConfig:
    """Sizes of the comparison.

    Attributes:
        models: checkpoint presets, each with its own workload (n requests).
        requests: number of requests per model.
        mixed: length distribution (arguments of mixed_workload, n excepted).
        pool_tokens: KV slots of the pool (a multiple of every block size).
        block_sizes: the sweep.
        repeats: rounds (each runs both modes at every block size).
        num_threads: pagedllm threads (default 1: on a shared 2-core machine, OpenMP workers
            of two threads spin against the other jobs and a run can take 20x longer).
    """

    models: Tuple[str, ...] = ("tiny", "small")
    requests: dict = field(default_factory=lambda: {"tiny": 64, "small": 16})
    mixed: dict = field(default_factory=lambda: dict(PRESSURE))
    pool_tokens: int = 1024
    block_sizes: Tuple[int, ...] = (8, 16, 32, 64)
    repeats: int = 4
    num_threads: Optional[int] = 1

    @classmethod
    def quick(cls) -> "PreemptionConfig":
        return cls(models=("tiny",), requests={"tiny": 16},
                   mixed=dict(PRESSURE, prompt_mean=48, output_mean=16, max_prompt=192,
                              max_output=64),
                   pool_tokens=512, repeats=1)


def swap_gib(reqs: List[BenchRequest], bytes_per_token: int) -> float:
    """A host pool (GiB) that holds every request's whole sequence at once, plus a margin."""
    tokens = sum(len(r.prompt_token_ids) + r.max_tokens + 64 for r in reqs)
    return max(0.01, 1.25 * tokens * bytes_per_token / 2 ** 30)


def percentile(xs: List[float], q: float) -> float:
    """The q-quantile (0..1) of xs, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def run_once(ckpt: str, reqs: List[BenchRequest], block_size: int, mode: str,
             pool_tokens: int, swap_space: float, max_len: int,
             num_threads: Optional[int]) -> dict:
    """One fresh engine, one run of the workload; returns its figures."""
    from pagedllm import LLM, SamplingParams

    llm = LLM(ckpt, block_size=block_size, num_kv_blocks=pool_tokens // block_size,
              enable_prefix_caching=False, max_num_seqs=256, max_model_len=max_len,
              num_threads=num_threads, preemption_mode=mode, swap_space=swap_space)
    worker = llm.engine.executor.worker
    before = worker.transfer.before_forward
    spent = [0.0]

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return before(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0

    worker.transfer.before_forward = timed

    def params(r):
        return SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True,
                              detokenize=False)

    llm.generate([{"prompt_token_ids": r.prompt_token_ids[:16]} for r in reqs[:2]],
                 [SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False)] * 2,
                 use_tqdm=False)  # warm-up, no preemption
    s0 = llm.kv_cache_stats()
    spent[0] = 0.0
    steps0 = llm.engine.num_steps
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": r.prompt_token_ids} for r in reqs],
                        [params(r) for r in reqs], use_tqdm=False)
    elapsed = time.perf_counter() - t0
    s1 = llm.kv_cache_stats()
    lat = [o.metrics["finish_time"] - o.metrics["arrival_time"] for o in outs]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    res = {"elapsed_s": elapsed, "output_tokens": tokens, "tokens_per_s": tokens / elapsed,
           "latency_p50_s": percentile(lat, 0.5), "latency_p99_s": percentile(lat, 0.99),
           "preemptions": s1["num_preemptions"] - s0["num_preemptions"],
           "swap_outs": s1["num_swap_outs"] - s0["num_swap_outs"],
           "swap_ins": s1["num_swap_ins"] - s0["num_swap_ins"],
           "transfer_s": spent[0], "steps": llm.engine.num_steps - steps0,
           "bytes_per_block": s1["bytes_per_block"], "device": s1["device"],
           "first_tokens": [list(o.outputs[0].token_ids[:8]) for o in outs]}
    del llm
    return res


KEYS = ("tokens_per_s", "latency_p50_s", "latency_p99_s", "preemptions", "swap_outs",
        "swap_ins", "transfer_s", "steps", "elapsed_s")


def run(cfg: Optional[PreemptionConfig] = None) -> dict:
    """Runs the comparison, writes preemption.json and returns its content."""
    from pagedllm.model.checkpoint import random_config

    cfg = cfg or PreemptionConfig()
    models = {}
    total = len(cfg.models) * len(cfg.block_sizes) * len(MODES) * cfg.repeats
    warmed = False
    with tqdm(total=total, desc="preemption", unit="run", dynamic_ncols=True) as bar:
        for model in cfg.models:
            mc = random_config(model)
            ckpt = checkpoint(model)
            reqs = mixed_workload(n=cfg.requests[model], vocab=mc.vocab_size, seed=0, **cfg.mixed)
            max_len = max(len(r.prompt_token_ids) + r.max_tokens for r in reqs)
            if max_len > cfg.pool_tokens:
                raise ValueError(f"pool_tokens={cfg.pool_tokens} cannot hold the longest "
                                 f"sequence ({max_len} tokens)")
            head_dim = mc.hidden_size // mc.num_attention_heads
            per_token = 2 * mc.num_hidden_layers * mc.num_key_value_heads * head_dim * 4
            gib = swap_gib(reqs, per_token)
            if not warmed:  # the process's first engine pays one-off costs: untimed
                run_once(ckpt, reqs[:4], cfg.block_sizes[0], "swap", cfg.pool_tokens, gib,
                         max_len, cfg.num_threads)
                warmed = True
            raw = {bs: {m: [] for m in MODES} for bs in cfg.block_sizes}
            for r in range(cfg.repeats):
                for bs in cfg.block_sizes:
                    for mode in (MODES if (r + cfg.block_sizes.index(bs)) % 2 == 0 else MODES[::-1]):
                        bar.set_postfix_str(f"{model}, block {bs}, {mode}, round {r + 1}")
                        raw[bs][mode].append(run_once(ckpt, reqs, bs, mode, cfg.pool_tokens, gib,
                                                      max_len, cfg.num_threads))
                        bar.update(1)
            models[model] = {"workload": {**describe(reqs), "generator": cfg.mixed},
                             "demand_tokens": sum(len(r.prompt_token_ids) + r.max_tokens
                                                  for r in reqs),
                             "swap_space_gib": round(gib, 4),
                             "block_sizes": {str(bs): _summarise(raw[bs]) for bs in cfg.block_sizes}}
    out = {"benchmark": "preemption", "pool_tokens": cfg.pool_tokens, "repeats": cfg.repeats,
           "num_threads": cfg.num_threads, "models": models}
    write_results("preemption", out)
    return out


def _summarise(runs: dict) -> dict:
    """Medians per mode, the per-round swap/recompute ratios' medians, greedy agreement."""
    out = {m: {k: round(statistics.median(x[k] for x in runs[m]), 4) for k in KEYS} for m in MODES}
    for m in MODES:
        out[m]["runs_tokens_per_s"] = [round(x["tokens_per_s"], 2) for x in runs[m]]
        out[m]["bytes_per_block"] = runs[m][0]["bytes_per_block"]
    pairs = list(zip(runs["swap"], runs["recompute"]))
    out["swap_over_recompute"] = {
        k: round(statistics.median(s[k] / r[k] for s, r in pairs), 4)
        for k in ("tokens_per_s", "latency_p50_s", "latency_p99_s")}
    out["same_tokens"] = all(s["first_tokens"] == r["first_tokens"] for s, r in pairs)
    return out


if __name__ == "__main__":
    run()
