"""decode_step before and after a change, alternately in fresh processes on the same machine.

The engine source of a git commit (`--before`) is extracted next to this checkout's prebuilt
`_core` (step_overhead_ab.extract: the old Python calls the kernels it knew, all still there);
then `benchmarks.decode_step` runs once per round on each tree for each (model, batch), so both
see the same load. Medians over the rounds of the step's wall time, its main-thread CPU time
(with --threads 1 every op runs on that thread: the figure other jobs disturb least) and of each
cProfile bucket.

Usage: PYTHONPATH=.:python python -m benchmarks.decode_step_ab [--before COMMIT] [--rounds 3]
       [--threads 1] [--points tiny:64,small:16]
Writes benchmarks/results/decode_step_ab.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import machine_info, write_results
from benchmarks.step_overhead_ab import ROOT, _head, extract


def one_run(src: Path, model: str, batch: int, threads: int, out: Path) -> dict:
    """decode_step once on the engine under src; returns its figures."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]),
               PAGEDLLM_BENCH_RESULTS_DIR=str(out), OMP_NUM_THREADS=str(threads))
    subprocess.run([sys.executable, "-m", "benchmarks.decode_step", "--model", model,
                    "--batch", str(batch), "--threads", str(threads)],
                   check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads((out / "decode_step.json").read_text())


def _median_of(runs: list) -> dict:
    return {"step_ms": round(statistics.median(r["step_ms"]["median"] for r in runs), 2),
            "step_cpu_ms": round(statistics.median(r["step_cpu_ms"] for r in runs), 2),
            "profiled_ms_per_step": {k: round(statistics.median(r["profiled_ms_per_step"][k]
                                                                for r in runs), 3)
                                     for k in runs[0]["profiled_ms_per_step"]},
            "floor_ms": runs[-1]["floor_ms"], "floor_ms_total": runs[-1]["floor_ms_total"],
            "loads": [r["machine"].get("load_avg_1m") for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="23d7011")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--points", default="tiny:64,small:16")
    a = ap.parse_args()
    points = [(p.split(":")[0], int(p.split(":")[1])) for p in a.points.split(",")]
    runs = {(tree, m, b): [] for tree in ("before", "after") for m, b in points}
    with tempfile.TemporaryDirectory() as tmp:
        before_src = extract(a.before, Path(tmp) / "before")
        out = Path(tmp) / "out"
        out.mkdir()
        for r in range(a.rounds):
            for m, b in points:
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                for tree in order:
                    src = before_src if tree == "before" else ROOT / "python"
                    runs[(tree, m, b)].append(one_run(src, m, b, a.threads, out))
                    print(f"round {r} {tree} {m} x {b}: "
                          f"{runs[(tree, m, b)][-1]['step_cpu_ms']} ms CPU", flush=True)
    result = {"benchmark": "decode_step_ab", "before": a.before, "after": _head(),
              "rounds": a.rounds, "threads": a.threads,
              "points": [{"model": m, "batch": b, "before": _median_of(runs[("before", m, b)]),
                          "after": _median_of(runs[("after", m, b)])} for m, b in points],
              "machine": machine_info()}
    write_results("decode_step_ab", result)
    print(markdown(result))


def markdown(r: dict) -> str:
    """Before / after per point and per cProfile bucket (ms per decode step, medians)."""
    lines = []
    for p in r["points"]:
        b, a = p["before"], p["after"]
        lines += [f"\"{p['model']}\" x {p['batch']} ({r['threads']} thread(s), {r['rounds']} "
                  f"rounds, `{r['before']}` -> `{r['after']}`)", "",
                  "| ms per decode step | before | after | after / before |",
                  "| --- | ---: | ---: | ---: |",
                  f"| main-thread CPU time | {b['step_cpu_ms']:.2f} | {a['step_cpu_ms']:.2f} | "
                  f"{a['step_cpu_ms'] / b['step_cpu_ms']:.2f}x |",
                  f"| wall time | {b['step_ms']:.2f} | {a['step_ms']:.2f} | "
                  f"{a['step_ms'] / b['step_ms']:.2f}x |"]
        for k, v in b["profiled_ms_per_step"].items():
            w = a["profiled_ms_per_step"][k]
            lines.append(f"| cProfile: {k} | {v:.2f} | {w:.2f} | "
                         f"{w / v if v else float('nan'):.2f}x |")
        lines += [f"| floor (total) | {a['floor_ms_total']:.2f} | | |", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
