"""Engine time per step, before and after a change, measured alternately on the same machine.

The engine source of a git commit (default 0c15e30, the baseline commit before the worker
redesign) is extracted with `git archive` into a temporary folder, next to this checkout's
prebuilt `_core`; then `bench_step_overhead.py` runs in a fresh process per round, alternately
on that tree ("before") and on this checkout ("after"), so both see the same load. Medians over
the rounds of each batch size's per-step medians, wall and main-thread CPU time.

With --chain C1,C2,... the same is done for a list of commits (the engine commits between two
points, say), the order rotated each round, to tell which commit moved the figure.

Usage: python -m benchmarks.step_overhead_ab [--rounds 3] [--before 0c15e30] [--after COMMIT]
       [--threads N] [--name step_overhead_ab]
       python -m benchmarks.step_overhead_ab --chain 0c15e30,c17add0,HEAD --name NAME
Writes benchmarks/results/<name>.json (default step_overhead_ab.json).
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

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ("step_ms", "forward_ms", "overhead_ms", "overhead_cpu_ms")


def extract(commit: str, dest: Path) -> Path:
    """The commit's python/pagedllm under dest, with this checkout's built _core linked in."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "python/pagedllm"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for so in (ROOT / "python" / "pagedllm").glob("_core*.so"):
        link = dest / "python" / "pagedllm" / so.name
        if not link.exists():
            link.symlink_to(so)
    return dest / "python"


def _head() -> str:
    """This checkout's commit (short), with "+" when its engine has uncommitted changes."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "python/pagedllm"],
                           capture_output=True, text=True).stdout.strip()
    return head + ("+" if dirty else "")


def one_round(src: Path, label: str, out: Path, extra: list) -> list:
    """Runs bench_step_overhead once on the engine under src; returns its rows."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]),
               PAGEDLLM_BENCH_RESULTS_DIR=str(out))
    subprocess.run([sys.executable, "-m", "benchmarks.bench_step_overhead", "--label", label]
                   + extra, check=True, env=env, cwd=ROOT)
    return json.loads((out / f"step_overhead_{label}.json").read_text())["rows"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="0c15e30", help="git commit of the 'before' engine")
    ap.add_argument("--after", default=None,
                    help="git commit of the 'after' engine (default: this checkout)")
    ap.add_argument("--after-tree", default=None,
                    help="a folder holding pagedllm/ (e.g. a patched copy) as the 'after' engine")
    ap.add_argument("--name", default="step_overhead_ab", help="results file stem")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch-sizes", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--chain", default=None, help="comma list of commits to measure in turn")
    args = ap.parse_args()
    extra = (["--quick"] if args.quick else []) + (
        ["--threads", str(args.threads)] if args.threads else []) + (
        ["--batch-sizes", args.batch_sizes] if args.batch_sizes else [])
    if args.chain:
        return chain(args.chain.split(","), args, extra)
    runs = {"before": [], "after": []}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        srcs = {"before": extract(args.before, tmp / "before"),
                "after": (Path(args.after_tree) if args.after_tree else
                          extract(args.after, tmp / "after") if args.after else ROOT / "python")}
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for label in order:
                print(f"--- round {r + 1}: {label}", flush=True)
                loads.append(round(os.getloadavg()[0], 2))
                runs[label].append(one_round(srcs[label], label, tmp, extra))
    table = {}
    for label, rounds in runs.items():
        for i, row in enumerate(rounds[0]):
            table.setdefault(str(row["batch"]), {})[label] = {
                f: round(statistics.median(rr[i][f] for rr in rounds), 4) for f in FIELDS}
            table[str(row["batch"])][label]["rounds_overhead_cpu_ms"] = [
                round(rr[i]["overhead_cpu_ms"], 4) for rr in rounds]
    for b, t in table.items():
        t["after_over_before_cpu"] = round(t["after"]["overhead_cpu_ms"] / t["before"]["overhead_cpu_ms"], 3)
        t["after_over_before_wall"] = round(t["after"]["overhead_ms"] / t["before"]["overhead_ms"], 3)
        print(f"batch {b:>4}: engine CPU before {t['before']['overhead_cpu_ms']:.3f} ms, after "
              f"{t['after']['overhead_cpu_ms']:.3f} ms ({t['after_over_before_cpu']:.2f}x)")
    write_results(args.name, {
        "benchmark": "step_overhead_ab", "before_commit": args.before,
        "after_commit": args.after_tree or args.after or _head(), "rounds": args.rounds,
        "threads": args.threads, "load_avg_1m_per_run": loads, "batches": table,
        "machine_start": machine_info()})


def chain(commits: list, args, extra: list) -> None:
    """Measures every commit of `commits` in each round (order rotated); medians per commit."""
    runs = {c: [] for c in commits}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        srcs = {c: extract(c, tmp / f"c{i}") for i, c in enumerate(commits)}
        for r in range(args.rounds):
            k = r % len(commits)
            for i, c in enumerate(commits[k:] + commits[:k]):
                print(f"--- round {r + 1}: {c}", flush=True)
                loads.append(round(os.getloadavg()[0], 2))
                runs[c].append(one_round(srcs[c], f"c{commits.index(c)}", tmp, extra))
    table = {}
    for c, rounds in runs.items():
        for i, row in enumerate(rounds[0]):
            table.setdefault(str(row["batch"]), {})[c] = {
                f: round(statistics.median(rr[i][f] for rr in rounds), 4) for f in FIELDS}
    for b, t in table.items():
        print(f"batch {b:>4}: engine CPU ms " + ", ".join(
            f"{c} {t[c]['overhead_cpu_ms']:.3f}" for c in commits))
    write_results(args.name, {"benchmark": "step_overhead_chain", "commits": commits,
                              "rounds": args.rounds, "threads": args.threads,
                              "load_avg_1m_per_run": loads, "batches": table})


if __name__ == "__main__":
    main()
