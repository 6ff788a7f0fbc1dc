"""Freed host memory kept in the process (engine/host_malloc.py) against glibc's default.

mallopt is process-wide and set once, so the two settings cannot share a process: each round
starts two fresh interpreters, PAGEDLLM_KEEP_FREED_MEMORY=0 and =1 (the order alternating),
each building the engine, warming it on two requests and then running the workload `--runs`
times; every run reports its wall time, the minor page faults it took and its system CPU
time (getrusage deltas). Reported: per setting the median wall time, faults and system time
over every run after the first of each process (the first still grows the heap), and the
median of the per-round wall-time ratios (off / on).

Usage: PYTHONPATH=.:python python -m benchmarks.malloc_ab [--model tiny] [--dtype float32]
           [--workload long|mixed] [--rounds 3] [--runs 3] [--long-prompt 16,1024,4032,64]
Writes benchmarks/results/malloc_ab_<model>_<dtype>_<workload>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import wait_until_quiet, write_results

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
from benchmarks.common import checkpoint
from benchmarks.engines import PagedEngine
from benchmarks.workloads import MIXED, long_prompt_workload, mixed_workload
from pagedllm.model.checkpoint import random_config
model, dtype, workload, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
n, lo, hi, out_len = (int(x) for x in sys.argv[5].split(","))
vocab = random_config(model).vocab_size
if workload == "long":
    reqs = long_prompt_workload(n, vocab, lo, hi, out_len, seed=7)
else:
    reqs = mixed_workload(200, vocab, seed=0, **MIXED)
eng = PagedEngine(checkpoint(model), dtype=dtype)
eng.generate(reqs[:2])
out = []
for _ in range(runs):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    eng.generate(reqs)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out.append({"wall_s": wall, "minor_faults": r1.ru_minflt - r0.ru_minflt,
                "sys_s": r1.ru_stime - r0.ru_stime, "user_s": r1.ru_utime - r0.ru_utime})
print("RESULT " + json.dumps(out))
"""


def run_child(keep: str, args) -> list:
    """One fresh process with PAGEDLLM_KEEP_FREED_MEMORY=keep; its runs' figures."""
    import pagedllm  # the child imports it from where this process does (tree or wheel)

    paths = [str(ROOT), str(Path(pagedllm.__file__).resolve().parents[1])]
    env = dict(os.environ, PAGEDLLM_KEEP_FREED_MEMORY=keep, PYTHONPATH=os.pathsep.join(paths))
    wait_until_quiet()
    p = subprocess.run([sys.executable, "-c", CHILD, args.model, args.dtype, args.workload,
                        str(args.runs), args.long_prompt], env=env, capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the PAGEDLLM_KEEP_FREED_MEMORY={keep} process failed "
                           f"(exit {p.returncode}):\n{p.stderr[-4000:]}")
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--workload", default="long", choices=("long", "mixed"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--long-prompt", default="16,1024,4032,64",
                    help="requests,min prompt,max prompt,output tokens of the long workload")
    args = ap.parse_args()
    if args.runs < 2:
        raise SystemExit("--runs must be >= 2 (the first run of each process is not counted)")
    per = {"0": [], "1": []}
    ratios = []
    for r in range(args.rounds):
        order = ["0", "1"] if r % 2 == 0 else ["1", "0"]
        walls = {}
        for keep in order:
            runs = run_child(keep, args)
            per[keep].append(runs)
            walls[keep] = statistics.median(x["wall_s"] for x in runs[1:])
            print(f"round {r + 1} keep={keep}: " + ", ".join(
                f"{x['wall_s']:.3f} s / {x['minor_faults']} faults / sys {x['sys_s']:.3f} s"
                for x in runs), flush=True)
        ratios.append(walls["0"] / walls["1"])
    summary = {}
    for keep, procs in per.items():
        runs = [x for p in procs for x in p[1:]]
        summary["kept" if keep == "1" else "default"] = {
            k: round(statistics.median(x[k] for x in runs), 4)
            for k in ("wall_s", "minor_faults", "sys_s", "user_s")}
    summary["speedup"] = round(statistics.median(ratios), 3)
    summary["speedup_rounds"] = [round(x, 3) for x in ratios]
    print(json.dumps(summary, indent=1))
    path = write_results(f"malloc_ab_{args.model}_{args.dtype}_{args.workload}",
                         {"config": vars(args), "summary": summary, "processes": per})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
