"""CPU bf16 vs fp32 weights: engine throughput and the greedy agreement it costs.

Per model preset, two engines are loaded in the same process, one with dtype="float32" and one
with dtype="bfloat16" (the KV cache dtype "auto", i.e. the model's dtype), and run the same
two seeded workloads alternately (`repeats` rounds, a different order each round):

- decode-bound: many sequences, short prompts, long outputs (output tokens/s);
- prefill-bound: long prompts, one output token each (prompt tokens/s).

The bf16/fp32 ratio is taken per round and its median reported. Quality: of the requests'
greedy outputs, the fraction whose first generated token is the same in bf16 as in fp32, and
the mean length of the identical prefix of the first 8 tokens. The CPU's bf16 flags
(avx512_bf16, amx_bf16) are recorded: without AMX, oneDNN's bf16 matmuls run on AVX512-BF16
dot products.

Usage: python -m benchmarks --only dtype [--quick]
Writes benchmarks/results/dtype.json.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from tqdm.auto import tqdm

from benchmarks.common import checkpoint, write_results
from benchmarks.engines import PagedEngine, RunResult, ample_blocks
from benchmarks.workloads import BenchRequest, uniform_workload

DTYPES = ("float32", "bfloat16")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


@dataclass
class DtypeConfig:
    """Sizes of the comparison.

    Attributes:
        models: checkpoint presets.
        decode: per model, (sequences, prompt tokens, output tokens) of the decode-bound run.
        prefill: per model, (sequences, prompt tokens) of the prefill-bound run (1 output token).
        repeats: interleaved rounds.
        num_threads: pagedllm threads (default 1: on a shared 2-core machine, OpenMP workers
            of two threads spin against the other jobs and a run can take 20x longer).
    """

    models: Tuple[str, ...] = ("tiny", "small")
    decode: Dict[str, tuple] = field(default_factory=lambda: {"tiny": (128, 16, 64),
                                                              "small": (64, 16, 48)})
    prefill: Dict[str, tuple] = field(default_factory=lambda: {"tiny": (16, 512),
                                                               "small": (8, 512)})
    repeats: int = 3
    num_threads: Optional[int] = 1

    @classmethod
    def quick(cls) -> "DtypeConfig":
        return cls(models=("tiny",), decode={"tiny": (16, 8, 16)}, prefill={"tiny": (4, 128)},
                   repeats=1)


def cpu_flags() -> dict:
    """Which of FLAGS /proc/cpuinfo lists (lscpu's "Flags")."""
    try:
        with open("/proc/cpuinfo") as f:
            have = next((line.split(":", 1)[1].split() for line in f
                         if line.startswith("flags")), [])
    except OSError:
        have = []
    return {fl: fl in have for fl in FLAGS}


def agreement(ref: List[List[int]], got: List[List[int]]) -> dict:
    """First-token agreement and mean identical prefix of got against ref."""
    def prefix(a, b):
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    return {"requests": len(ref),
            "first_token_identical": round(sum(a[:1] == b[:1] for a, b in zip(ref, got)) / len(ref), 4),
            "mean_identical_prefix_of_8": round(statistics.fmean(prefix(a, b) for a, b in zip(ref, got)), 2)}


def _rate(res: RunResult, reqs: List[BenchRequest], kind: str) -> float:
    if kind == "prefill":
        return sum(len(r.prompt_token_ids) for r in reqs) / res.elapsed_s
    return res.tokens_per_s


def run(cfg: Optional[DtypeConfig] = None) -> dict:
    """Runs the comparison, writes dtype.json and returns its content."""
    from pagedllm.model.checkpoint import random_config

    cfg = cfg or DtypeConfig()
    models = {}
    total = len(cfg.models) * 2 * len(DTYPES) * cfg.repeats
    with tqdm(total=total, desc="dtype", unit="run", dynamic_ncols=True) as bar:
        for model in cfg.models:
            vocab = random_config(model).vocab_size
            n, p, o = cfg.decode[model]
            n_pre, p_pre = cfg.prefill[model]
            work = {"decode": uniform_workload(n, vocab, p, o, seed=0),
                    "prefill": uniform_workload(n_pre, vocab, p_pre, 1, seed=1)}
            blocks = max(ample_blocks(w, 16) for w in work.values())
            max_len = max(len(r.prompt_token_ids) + r.max_tokens for w in work.values() for r in w)
            engines = {dt: PagedEngine(checkpoint(model), block_size=16, num_kv_blocks=blocks,
                                       max_model_len=max_len, num_threads=cfg.num_threads,
                                       dtype=dt) for dt in DTYPES}
            for e in engines.values():
                e.generate(work["decode"][:2])  # warm-up
            raw = {k: {dt: [] for dt in DTYPES} for k in work}
            tokens = {k: {} for k in work}
            for r in range(cfg.repeats):
                for kind, reqs in work.items():
                    for dt in (DTYPES if r % 2 == 0 else DTYPES[::-1]):
                        bar.set_postfix_str(f"{model}, {kind}, {dt}, round {r + 1}")
                        res = engines[dt].generate(reqs)
                        raw[kind][dt].append(_rate(res, reqs, kind))
                        tokens[kind][dt] = res.first_tokens
                        bar.update(1)
            stats = engines["bfloat16"].llm.kv_cache_stats()
            models[model] = {
                "kv_cache_dtype_bf16_engine": stats.get("kv_cache_dtype"),
                "bytes_per_block": {dt: e.llm.kv_cache_stats()["bytes_per_block"]
                                    for dt, e in engines.items()},
                **{kind: {
                    "sequences": len(work[kind]),
                    "prompt_tokens": len(work[kind][0].prompt_token_ids),
                    "output_tokens": work[kind][0].max_tokens,
                    "unit": "prompt tokens/s" if kind == "prefill" else "output tokens/s",
                    **{dt: {"tokens_per_s": round(statistics.median(raw[kind][dt]), 2),
                            "runs_tokens_per_s": [round(x, 2) for x in raw[kind][dt]]}
                       for dt in DTYPES},
                    "bf16_over_fp32": round(statistics.median(
                        b / f for b, f in zip(raw[kind]["bfloat16"], raw[kind]["float32"])), 4),
                    "agreement": agreement(tokens[kind]["float32"], tokens[kind]["bfloat16"]),
                } for kind in work}}
            del engines
    out = {"benchmark": "dtype", "repeats": cfg.repeats, "num_threads": cfg.num_threads,
           "cpu_flags": cpu_flags(), "models": models}
    write_results("dtype", out)
    return out


if __name__ == "__main__":
    run()
