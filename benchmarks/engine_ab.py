"""Two engine settings side by side in one process: one workload run on each, alternately.

Each variant is an engine built under its own environment variables (read at construction,
such as PAGEDLLM_HUGE_PAGES for where the KV pool lives) or its own `block_size`, or run under
its own CPU attention engine (`cpu_engine`: `_core.set_cpu_engine` before each of its runs,
"auto" restored at the end); all are
warmed up, then every round runs the workload once on each, the order rotating, each run
started on idle CPUs (common.wait_until_quiet). Same process, same checkpoint and machine
state, so the per-round time ratios (first variant / each other one) are the figure; their
median is reported, with the median wall times.

Usage: PYTHONPATH=.:python python -m benchmarks.engine_ab --vary PAGEDLLM_HUGE_PAGES=0,1
           [--model tiny] [--dtype float32] [--workload long|mixed|uniform] [--requests 16]
           [--prompt-len 128] [--output-len 64] [--max-prompt 4032] [--rounds 4]
       ... --vary block_size=16,64
       ... --vary cpu_engine=avx512,auto --dtype bfloat16 --kv-cache-dtype fp8
       ... --vary PAGEDLLM_DECODER_STACK=0,1 --workload uniform --requests 1
       ... --vary PAGEDLLM_LINEAR=onednn,pagedllm --isa avx2   (an AVX2-only CPU, emulated)
Prints each round and the summary; writes benchmarks/results/engine_ab_<name>.json (an emulated
instruction set adds _<isa> to the name, so that it never replaces a native run's file).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks import isa
from benchmarks.bench_throughput import ThroughputConfig
from benchmarks.common import checkpoint, wait_until_quiet, write_results
from benchmarks.engines import PagedEngine
from benchmarks.workloads import long_prompt_workload, mixed_workload, uniform_workload
from pagedllm import _core


def parse_vary(text: str):
    """'NAME=a,b,...' -> (NAME, [a, b, ...]); NAME is block_size, cpu_engine or an environment
    variable."""
    name, _, values = text.partition("=")
    vals = [v for v in values.split(",") if v]
    if not name or len(vals) < 2:
        raise SystemExit(f"--vary {text!r}: expected NAME=VALUE1,VALUE2[,...]")
    return name, vals


def build(name: str, value: str, model: str, dtype: str, kv_cache_dtype: str) -> PagedEngine:
    """An engine with `name` set to `value` (the environment restored after; cpu_engine is set
    per run instead)."""
    kw = {"dtype": dtype, "kv_cache_dtype": kv_cache_dtype}
    if name == "block_size":
        return PagedEngine(checkpoint(model), block_size=int(value), **kw)
    if name == "cpu_engine":
        return PagedEngine(checkpoint(model), **kw)
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return PagedEngine(checkpoint(model), **kw)
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def results_tag(name: str, args: argparse.Namespace) -> str:
    """The results file's name after engine_ab_: what varies, the model, dtypes and workload,
    and the instruction set when it is not the native one."""
    tag = f"{name.lower()}_{args.model}_{args.dtype}_{args.kv_cache_dtype}_{args.workload}"
    if args.workload == "uniform":
        tag += f"{args.requests}"
    if args.isa != "native":
        tag += f"_{args.isa}"
    return tag


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vary", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto, bf16, fp8, ...")
    ap.add_argument("--workload", choices=("long", "mixed", "uniform"), default="long")
    ap.add_argument("--requests", type=int, default=16,
                    help="long / uniform workloads: requests (uniform: all submitted at once)")
    ap.add_argument("--prompt-len", type=int, default=128, help="uniform workload: prompt tokens")
    ap.add_argument("--output-len", type=int, default=64,
                    help="long / uniform workloads: tokens out")
    ap.add_argument("--max-prompt", type=int, default=4032, help="long workload: longest prompt")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--isa", default="native", choices=isa.ISAS,
                    help="instruction set every engine is held to (benchmarks/isa.py)")
    args = ap.parse_args(argv)
    isa.emulate(args.isa)  # re-executes this command under the ISA's variables where needed
    isa_check = isa.check(args.isa)
    name, values = parse_vary(args.vary)
    from pagedllm.model.checkpoint import random_config

    vocab = random_config(args.model).vocab_size

    def use(v):  # the CPU attention engine of variant v, when that is what varies
        if name == "cpu_engine":
            _core.set_cpu_engine(v)

    engines = {}
    for v in values:
        engines[v] = build(name, v, args.model, args.dtype, args.kv_cache_dtype)
        use(v)
        engines[v].generate(uniform_workload(4, vocab, 32, 8, seed=99))
    if args.workload == "long":
        reqs = long_prompt_workload(args.requests, vocab, 1024, args.max_prompt,
                                    args.output_len, seed=7)
    elif args.workload == "uniform":
        reqs = uniform_workload(args.requests, vocab, args.prompt_len, args.output_len)
    else:
        reqs = mixed_workload(vocab=vocab, seed=0, **ThroughputConfig().mixed)
    times = {v: [] for v in values}
    for r in range(args.rounds):
        order = values[r % len(values):] + values[:r % len(values)]
        for v in order:
            use(v)
            wait_until_quiet()
            t = time.perf_counter()
            engines[v].generate(reqs)
            times[v].append(time.perf_counter() - t)
        print(f"round {r + 1}: " + ", ".join(f"{name}={v} {times[v][-1]:.3f} s" for v in values),
              flush=True)
    if name == "cpu_engine":
        _core.set_cpu_engine("auto")
    base = values[0]
    summary = {v: {"median_s": statistics.median(times[v]), "runs_s": times[v],
                   "speedup_vs_first": statistics.median(a / b for a, b in
                                                         zip(times[base], times[v]))}
               for v in values}
    for v in values:
        print(f"{name}={v}: median {summary[v]['median_s']:.3f} s, "
              f"{summary[v]['speedup_vs_first']:.3f}x {name}={base} (median of round ratios)")
    write_results(f"engine_ab_{results_tag(name, args)}", {
        "vary": name, "values": values, "model": args.model, "dtype": args.dtype,
        "isa": isa_check,
        "kv_cache_dtype": args.kv_cache_dtype,
        "workload": args.workload, "requests": len(reqs), "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "max_prompt": args.max_prompt, "rounds": args.rounds, "results": summary})


if __name__ == "__main__":
    main()
