"""cProfile of the engine's decode steps (main-thread CPU time), to see where engine time goes.

The same setup as bench_step_overhead.py ("tiny", one batch decoding, prompts of 32 tokens);
the profiler's clock is time.thread_time, so other jobs on a shared machine do not count. Runs
on whichever pagedllm is importable: point PYTHONPATH at another tree to profile it (e.g. the
"before" tree step_overhead_ab.py extracts). Prints the functions of the engine package with
their own and cumulative time per step; --json writes them.

Usage: python -m benchmarks.profile_step_overhead [--batch 64] [--steps 100] [--json out.json]
       python -m benchmarks.profile_step_overhead --finite-check   # the sampler's finite check
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time


def profile(batch: int, steps: int, threads: int = 1) -> pstats.Stats:
    """Profiles `steps` decode steps of `batch` sequences (after prefill and one warm step)."""
    from pagedllm import SamplingParams
    from pagedllm.config import EngineConfig
    from pagedllm.engine.llm_engine import LLMEngine

    from benchmarks.common import checkpoint

    engine = LLMEngine(EngineConfig(model=checkpoint("tiny"), max_num_seqs=batch,
                                    enable_prefix_caching=False, seed=0, num_threads=threads))
    sp = SamplingParams(max_tokens=steps + 4, ignore_eos=True, temperature=0.0)
    for i in range(batch):
        engine.add_request(f"r{i}", {"prompt_token_ids": [(7 * i + j) % 4000 + 1 for j in range(32)]}, sp)
    engine.step()
    engine.step()
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    for _ in range(steps):
        engine.step()
    prof.disable()
    return pstats.Stats(prof)


def rows(stats: pstats.Stats, steps: int, match: str = "pagedllm", top: int = 40) -> list:
    """(function, calls per step, own us per step, cumulative us per step), by own time."""
    out = []
    for (path, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        if match in path or path == "~":
            short = path.split("pagedllm/")[-1] if "pagedllm/" in path else path
            out.append({"function": f"{short}:{line}:{name}", "calls_per_step": round(nc / steps, 2),
                        "own_us_per_step": round(1e6 * tt / steps, 1),
                        "cum_us_per_step": round(1e6 * ct / steps, 1)})
    out.sort(key=lambda r: -r["own_us_per_step"])
    return out[:top]


def finite_check_costs(vocab: int = 4096, batches=(1, 16, 64, 256), n: int = 200) -> list:
    """Main-thread CPU µs of ways to ask "are these logits all finite?" ([batch, vocab] fp32,
    one torch thread): the sampler's torch.isfinite(x).all(), one aminmax pass (NaN
    propagates into min and max), and isfinite of the sum (may say no for huge finite
    values, which only sends the sampler down its exact path)."""
    import torch

    torch.set_num_threads(1)

    def cost(fn) -> float:
        for _ in range(10):
            fn()
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        return round(1e6 * (time.thread_time() - t0) / n, 1)

    out = []
    for b in batches:
        x = torch.randn(b, vocab)
        mm = torch.aminmax
        out.append({"batch": b, "vocab": vocab,
                    "isfinite_all_us": cost(lambda: bool(torch.isfinite(x).all())),
                    "aminmax_us": cost(lambda: bool(torch.isfinite(torch.stack(mm(x))).all())),
                    "isfinite_sum_us": cost(lambda: bool(torch.isfinite(x.sum())))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json", default=None)
    ap.add_argument("--finite-check", action="store_true",
                    help="only time the sampler's finite check against cheaper ones")
    args = ap.parse_args()
    if args.finite_check:
        rows_ = [r for v in (4096, 32000) for r in finite_check_costs(v)]
        for r in rows_:
            print(r)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows_, f, indent=1)
        return
    import pagedllm

    stats = profile(args.batch, args.steps)
    total = sum(tt for (_, _, _), (_, _, tt, _, _) in stats.stats.items())
    res = {"pagedllm": pagedllm.__file__, "batch": args.batch, "steps": args.steps,
           "profiled_cpu_us_per_step": round(1e6 * total / args.steps, 1),
           "engine_rows": rows(stats, args.steps, top=args.top),
           "all_rows": rows(stats, args.steps, match="", top=args.top)}
    print(f"{res['pagedllm']}: batch {args.batch}, {res['profiled_cpu_us_per_step']} us CPU per "
          f"step under the profiler")
    for r in res["all_rows"]:
        print(f"{r['own_us_per_step']:9.1f} {r['cum_us_per_step']:9.1f} {r['calls_per_step']:7.2f}  {r['function']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
