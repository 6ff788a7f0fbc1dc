"""Engines sharing the cores: one pagedllm process alone, then several at once, per wait policy.

A machine often runs more than one job. The kernels share torch's OpenMP team, whose threads
spin at every join while a partner thread may be descheduled; two such processes on the same
cores can each run far slower than their fair share. This script measures it: for each setting
(an environment, e.g. "default", "OMP_WAIT_POLICY=passive", "PAGEDLLM_THREAD_RUNTIME=builtin"),
one process runs the workload alone, then `--copies` processes run it at the same moment (each
loads and warms up first, then all start together); with `--neighbor SETTING` every copy but
the first runs under that setting instead (an engine beside other programs:
"PAGEDLLM_THREAD_RUNTIME=builtin" with the neighbor "default" is pagedllm's own pool beside an
engine on torch's spinning OpenMP team). Every process times `--rounds` runs of the
whole workload (greedy, forced output lengths, only the generate call timed). Reported per
setting and workload: the median run alone, the median over the runs together of every copy
of the setting (the first copy only, with a neighbor), and together / (alone x copies): 1.0 is
a fair share of the cores, above it time lost to the sharing itself.

Usage: PYTHONPATH=.:python python -m benchmarks.contention [--model tiny]
       [--workloads long,mixed] [--copies 2] [--rounds 3]
       [--settings default,OMP_WAIT_POLICY=passive,PAGEDLLM_THREAD_RUNTIME=builtin]
       [--neighbor SETTING] [--name contention]
Writes benchmarks/results/contention.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks.common import write_results

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("long", "mixed", "quick")


def workload(name: str, model: str) -> list:
    """"long": 8 prompts of 1k-4k tokens, 64 out; "mixed": 64 requests of the mixed workload;
    "quick": 2 requests of 16 tokens, 4 out (the smoke test's)."""
    from benchmarks.workloads import long_prompt_workload, mixed_workload
    from pagedllm.model.checkpoint import random_config

    vocab = random_config(model).vocab_size
    if name == "long":
        return long_prompt_workload(8, vocab, 1024, 4032, 64, seed=7)
    if name == "mixed":
        return mixed_workload(64, vocab, seed=0)
    if name == "quick":
        return long_prompt_workload(2, vocab, 16, 16, 4, seed=7)
    raise ValueError(f"unknown workload {name!r}: expected one of {', '.join(WORKLOADS)}")


def child(a: argparse.Namespace) -> None:
    """One process: load and warm up, wait for the shared start time, run; print JSON."""
    from benchmarks.common import checkpoint
    from benchmarks.engines import PagedEngine

    engine = PagedEngine(checkpoint(a.model))
    reqs = workload(a.workload, a.model)
    engine.generate(reqs[:2])
    Path(a.ready).touch()
    while not Path(a.go).exists():
        time.sleep(0.01)
    times = [engine.generate(reqs).elapsed_s for _ in range(a.rounds)]
    print(json.dumps({"times_s": times}))


def parse_setting(setting: str) -> Dict[str, str]:
    """"default" -> {}; "A=1+B=2" -> {"A": "1", "B": "2"}."""
    if setting == "default":
        return {}
    env = {}
    for part in setting.split("+"):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"setting {setting!r}: expected 'default' or NAME=VALUE[+NAME=VALUE]")
        env[key] = value
    return env


def run_together(a: argparse.Namespace, setting: str, name: str, copies: int,
                 tmp: Path, neighbor: Optional[str] = None) -> List[List[float]]:
    """`copies` child processes on workload `name`, started together (all but the first under
    `neighbor` when set); their run times, in copy order."""
    go = tmp / f"go-{setting}-{name}-{copies}"
    procs, ready = [], []
    for i in range(copies):
        env = dict(os.environ, **parse_setting(setting if i == 0 or neighbor is None
                                                 else neighbor))
        flag = tmp / f"ready-{setting}-{name}-{copies}-{i}"
        ready.append(flag)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "benchmarks.contention", "--child", "--model", a.model,
             "--workload", name, "--rounds", str(a.rounds), "--ready", str(flag), "--go",
             str(go)], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True))
    try:
        while not all(f.exists() for f in ready):
            if any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError(f"a {name} process under {setting!r} failed to start")
            time.sleep(0.05)
        go.touch()
        outs = [p.communicate()[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"a {name} process under {setting!r} failed")
    return [json.loads(o.strip().splitlines()[-1])["times_s"] for o in outs]


def markdown(r: dict) -> str:
    beside = f" (beside {r['neighbor']})" if r.get("neighbor") else ""
    lines = [f"| setting | workload | alone s | {r['copies']} at once s{beside} | share lost |",
             "| --- | --- | ---: | ---: | ---: |"]
    for row in r["rows"]:
        lines.append(f"| {row['setting']} | {row['workload']} | {row['alone_s']:.2f} | "
                     f"{row['together_s']:.2f} | {row['vs_fair_share']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--workloads", default="long,mixed")
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings",
                    default="default,OMP_WAIT_POLICY=passive,PAGEDLLM_THREAD_RUNTIME=builtin")
    ap.add_argument("--neighbor", help="the setting of every copy but the first")
    ap.add_argument("--name", default="contention")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--ready", help=argparse.SUPPRESS)
    ap.add_argument("--go", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return
    names = a.workloads.split(",")
    settings = a.settings.split(",")
    for n in names:
        workload(n, a.model)  # an unknown name fails here, before any process starts
    for s in settings + ([a.neighbor] if a.neighbor else []):
        parse_setting(s)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for setting in settings:
            for n in names:
                alone = run_together(a, setting, n, 1, Path(tmp))
                together = run_together(a, setting, n, a.copies, Path(tmp), a.neighbor)
                alone_s = statistics.median(alone[0])
                measured = together[:1] if a.neighbor else together
                together_s = statistics.median(t for copy in measured for t in copy)
                rows.append({"setting": setting, "workload": n, "alone_runs_s": alone[0],
                             "together_runs_s": together, "alone_s": alone_s,
                             "together_s": together_s,
                             "vs_fair_share": together_s / (alone_s * a.copies)})
                print(f"{setting} {n}: alone {alone_s:.2f} s, {a.copies} at once "
                      f"{together_s:.2f} s ({rows[-1]['vs_fair_share']:.2f}x a fair share)",
                      flush=True)
    result = {"benchmark": "contention", "model": a.model, "copies": a.copies,
              "neighbor": a.neighbor, "rounds": a.rounds, "rows": rows}
    write_results(a.name, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
