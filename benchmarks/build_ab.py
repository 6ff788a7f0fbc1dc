"""Two builds of pagedllm on the same requests, alternately in fresh processes.

For a C++ change (a kernel, a threading threshold) the engine's Python is the same and only the
`_core` extension differs, so the comparison must load each build in its own process: this script
runs `--before` (a directory holding a `pagedllm` package with its built `_core`, e.g. a copy of
python/ taken before the change was built) and `--after` (default: where this process imports
pagedllm from, python/ in a developer build) in turns, fresh processes each round, the order
alternating, so both see the same load. Each process loads the model once, warms up on the
workload, then times it `--repeats` times (greedy, forced output length, only the generate call
timed) and reports its median. The requests are benchmarks.workloads.uniform_workload's.

Usage: PYTHONPATH=.:python python -m benchmarks.build_ab --before DIR [--after DIR] [--model tiny]
       [--dtype float32] [--requests 1] [--prompt 128] [--output 64] [--rounds 6]
       [--repeats 30] [--isa native|avx2] [--name build_ab]
Prints each round and the median of the per-round ratios; writes benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import isa
from benchmarks.common import write_results

ROOT = Path(__file__).resolve().parent.parent


def child(a: argparse.Namespace) -> None:
    """One process: load, warm up, time the workload `repeats` times; print JSON (the
    emulation checked first: isa.check)."""
    from benchmarks.common import checkpoint
    from benchmarks.engines import PagedEngine
    from benchmarks.workloads import uniform_workload
    from pagedllm import _core
    from pagedllm.model.checkpoint import random_config

    ran = isa.check(a.isa)
    engine = PagedEngine(checkpoint(a.model), dtype=a.dtype)
    reqs = uniform_workload(a.requests, random_config(a.model).vocab_size, a.prompt, a.output)
    engine.generate(reqs)
    times = [engine.generate(reqs).elapsed_s for _ in range(a.repeats)]
    print(json.dumps({"median_s": statistics.median(times), "min_s": min(times),
                      "core": _core.__file__, "ran": ran}))


def one_run(src: Path, a: argparse.Namespace) -> dict:
    """The child on the package under src (its own process, the ISA's variables set)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]),
               **isa.isa_env(a.isa))
    args = [sys.executable, "-m", "benchmarks.build_ab", "--child", "--model", a.model,
            "--dtype", a.dtype, "--requests", str(a.requests), "--prompt", str(a.prompt),
            "--output", str(a.output), "--repeats", str(a.repeats)]
    done = subprocess.run(args, check=True, env=env, cwd=ROOT, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a directory holding the 'before' pagedllm package")
    ap.add_argument("--after", help="a directory holding the 'after' pagedllm package "
                    "(default: the one this process imports)")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--isa", default="native", choices=isa.ISAS)
    ap.add_argument("--name", default="build_ab")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return
    if a.after is None:
        import pagedllm

        a.after = str(Path(pagedllm.__file__).parent.parent)
    for which in ("before", "after"):
        if not getattr(a, which) or not (Path(getattr(a, which)) / "pagedllm").is_dir():
            ap.error(f"--{which} must be a directory holding a pagedllm package, got "
                     f"{getattr(a, which)!r}")
    trees = {"before": Path(a.before).absolute(), "after": Path(a.after).absolute()}
    runs = {"before": [], "after": []}
    ratios = []
    for r in range(a.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        got = {}
        for tree in order:
            got[tree] = one_run(trees[tree], a)
            runs[tree].append(got[tree])
        ratios.append(got["before"]["median_s"] / got["after"]["median_s"])
        print(f"round {r}: before {got['before']['median_s'] * 1e3:.2f} ms, after "
              f"{got['after']['median_s'] * 1e3:.2f} ms, {ratios[-1]:.3f}x", flush=True)
    result = {"benchmark": "build_ab", "model": a.model, "dtype": a.dtype, "isa": a.isa,
              "requests": a.requests, "prompt": a.prompt, "output": a.output,
              "rounds": a.rounds, "repeats": a.repeats,
              "trees": {t: str(p) for t, p in trees.items()},
              "runs": runs, "ratios": ratios,
              "median_ms": {t: statistics.median(x["median_s"] for x in v) * 1e3
                            for t, v in runs.items()},
              "median_ratio": statistics.median(ratios)}
    write_results(a.name, result)
    print(f"median of the round ratios (before / after): {result['median_ratio']:.3f}x")


if __name__ == "__main__":
    main()
