"""Where pagedllm's time goes: cProfile of the mixed and the uniform workload, bucketed.

Each function's own time (cProfile tottime) goes to one bucket: the matmuls (torch's linear),
the _core attention kernels, the KV-cache write, other torch operators, the scheduler and KV
manager, the sampler, the model runner's input preparation, and the rest of the engine. The
profiler's own overhead inflates the Python buckets somewhat; the torch and kernel buckets are
C calls and barely affected. Reported per workload: the seconds and shares of each bucket, the
per-step times and the 15 functions with the most own time.

Usage: python -m benchmarks --only profile
Writes benchmarks/results/profile.json.
"""

from __future__ import annotations

import cProfile
import pstats
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from tqdm.auto import tqdm

from benchmarks.common import checkpoint, write_results
from benchmarks.engines import PagedEngine
from benchmarks.workloads import MIXED, QUICK_MIXED, mixed_workload, uniform_workload

# (bucket, predicate on (file, function name)); the first match wins.
BUCKETS = (
    ("matmuls (torch linear, oneDNN packed)",
     lambda f, n: "_nn.linear" in n or n.endswith("method matmul>") or "_linear_pointwise" in n),
    ("attention kernels (_core)", lambda f, n: "paged_attention" in n),
    ("KV cache write (_core)", lambda f, n: "reshape_and_cache" in n),
    ("scheduler + KV manager", lambda f, n: "scheduler.py" in f or "KVCacheManager" in n
     or "append_batch" in n or "block_tables" in n),
    ("sampler", lambda f, n: "sampler.py" in f),
    ("runner input prep", lambda f, n: "model_runner.py" in f or "attention.py" in f),
    ("other torch ops", lambda f, n: "torch" in n or "torch" in f or "Tensor" in n),
    ("engine, outputs, Python rest", lambda f, n: True),
)


@dataclass
class ProfileConfig:
    """What to profile.

    Attributes:
        model: checkpoint preset.
        mixed: arguments of mixed_workload (a subset of the throughput section's).
        uniform: (requests, prompt, output) of the uniform workload.
        num_threads: pagedllm threads.
    """

    model: str = "small"
    mixed: dict = field(default_factory=lambda: dict(MIXED, n=24))
    uniform: Tuple[int, int, int] = (16, 128, 64)
    num_threads: Optional[int] = None

    @classmethod
    def quick(cls) -> "ProfileConfig":
        return cls(model="tiny", mixed=dict(QUICK_MIXED, n=8),
                   uniform=(4, 32, 16))


def bucketize(stats: pstats.Stats) -> Tuple[Dict[str, float], list]:
    """Own time per bucket, and the top functions by own time."""
    buckets = {name: 0.0 for name, _ in BUCKETS}
    rows = []
    for (file, line, name), (cc, nc, tt, ct, callers) in stats.stats.items():
        for bucket, match in BUCKETS:
            if match(file, name):
                buckets[bucket] += tt
                break
        rows.append((tt, nc, f"{file.rsplit('/', 2)[-1] if file != '~' else ''}:{name}"))
    rows.sort(reverse=True)
    top = [{"function": r[2], "own_s": round(r[0], 4), "calls": r[1]} for r in rows[:15]]
    return buckets, top


def profile_run(engine: PagedEngine, reqs) -> dict:
    """Runs `reqs` under cProfile; the bucketed breakdown."""
    prof = cProfile.Profile()
    steps0 = engine.llm.engine.num_steps
    prof.enable()
    res = engine.generate(reqs)
    prof.disable()
    steps = engine.llm.engine.num_steps - steps0
    buckets, top = bucketize(pstats.Stats(prof))
    total = sum(buckets.values())
    return {"elapsed_s": round(res.elapsed_s, 3), "profiled_s": round(total, 3), "steps": steps,
            "output_tokens": res.output_tokens,
            "tokens_per_s_under_profiler": round(res.tokens_per_s, 1),
            "ms_per_step": round(1e3 * res.elapsed_s / steps, 2),
            "buckets_s": {k: round(v, 3) for k, v in buckets.items()},
            "buckets_share": {k: round(v / total, 4) for k, v in buckets.items()},
            "top_functions": top}


def run(cfg: Optional[ProfileConfig] = None) -> dict:
    """Profiles both workloads, writes profile.json and returns its content."""
    from pagedllm.model.checkpoint import random_config

    cfg = cfg or ProfileConfig()
    vocab = random_config(cfg.model).vocab_size
    n, p, o = cfg.uniform
    work = {"uniform": uniform_workload(n, vocab, p, o, seed=7),
            "mixed": mixed_workload(vocab=vocab, seed=0, **cfg.mixed)}
    engine = PagedEngine(checkpoint(cfg.model), num_threads=cfg.num_threads)
    engine.generate(work["uniform"][:2])  # warm-up
    out = {"benchmark": "profile", "model": cfg.model,
           "workloads": {"uniform": {"requests": n, "prompt_len": p, "output_len": o},
                         "mixed": cfg.mixed}}
    for name in tqdm(work, desc="profile", unit="run", dynamic_ncols=True):
        out[name] = profile_run(engine, work[name])
    write_results("profile", out)
    return out


if __name__ == "__main__":
    run()
