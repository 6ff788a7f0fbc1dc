"""Cost of the diagnostics of issue 17: check_numerics (per-layer probe + logits check) and the
step trace (--profile-trace, with and without --profile-layers), against the same engine with
neither.

For each model preset ("tiny", "small") one workload of greedy requests (prefix caching off, so
every round computes the same) runs under each mode, the modes interleaved round by round in one
process (the machine is shared: interleaving spreads the load over all modes alike):

  off        the engine with check_numerics="off", no trace
  control    a second engine like "off" (the difference two engine instances make alone)
  numerics   a third engine with check_numerics="fail"
  trace      the "off" engine with start_trace(FILE) around the run (the file written included)
  layers     the same with layers=True (a span per decoder layer)

Reported per mode, for the process's CPU time (time.process_time: what the run itself
computed; on a loaded machine, wall time mostly measures the other jobs) and for wall time:
the median, and the median over rounds of the run's time / the same round's "off" time (a
paired ratio, robust to the load drifting between rounds).

Usage:  PYTHONPATH=python python benchmarks/bench_diagnostics_cost.py [--rounds 7] [--threads 1]
        [--models tiny,small] [--quick] [--out FILE.json]
Writes benchmarks/results/diagnostics_cost.json (or --out) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks import common  # noqa: E402

MODES = ("off", "control", "numerics", "trace", "layers")
# preset -> (prompts, prompt length range, output tokens)
WORKLOADS = {"tiny": (32, (16, 128), 128), "small": (8, (32, 96), 32)}
QUICK = {"tiny": (4, (8, 16), 8), "small": (2, (8, 16), 4)}


def prompts(n: int, lo: int, hi: int, vocab: int, seed: int = 0):
    import random

    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))]}
            for _ in range(n)]


def run_once(llm, reqs, params, trace_path=None, layers=False) -> tuple:
    """(CPU seconds, wall seconds) of one generate() (with the trace started before and
    written after)."""
    c0, t0 = time.process_time(), time.perf_counter()
    if trace_path is not None:
        llm.start_trace(trace_path, layers=layers)
    llm.generate(reqs, params, use_tqdm=False)
    if trace_path is not None:
        llm.stop_trace()
    return time.process_time() - c0, time.perf_counter() - t0


def bench_model(preset: str, rounds: int, threads: int, quick: bool) -> dict:
    from pagedllm import LLM, SamplingParams
    from pagedllm.model.checkpoint import random_config

    n, (lo, hi), out_len = (QUICK if quick else WORKLOADS)[preset]
    path = common.checkpoint(preset)
    vocab = random_config(preset).vocab_size
    reqs = prompts(n, lo, hi, vocab)
    params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    kw = dict(block_size=16, num_kv_blocks=2048, enable_prefix_caching=False, num_threads=threads)
    off = LLM(path, **kw)
    steps_before = off.engine.num_steps
    control = LLM(path, **kw)
    checked = LLM(path, check_numerics="fail", **kw)
    tmp = tempfile.mkdtemp(prefix="pagedllm-trace-cost-")
    trace = os.path.join(tmp, "t.json")
    runs = {
        "off": lambda: run_once(off, reqs, params),
        "control": lambda: run_once(control, reqs, params),
        "numerics": lambda: run_once(checked, reqs, params),
        "trace": lambda: run_once(off, reqs, params, trace),
        "layers": lambda: run_once(off, reqs, params, trace, layers=True),
    }
    runs["off"]()
    steps_per_run = off.engine.num_steps - steps_before
    for fn in runs.values():  # warm-up: first-call costs (oneDNN, allocator) out of the rounds
        fn()
    times = {m: [] for m in MODES}
    loads = [os.getloadavg()[0]]
    for r in range(rounds):
        order = MODES if r % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            times[mode].append(runs[mode]())
        loads.append(os.getloadavg()[0])
    
    with open(trace) as f:
        spans_per_run = sum(1 for e in json.load(f)["traceEvents"] if e.get("ph") == "X")
    shutil.rmtree(tmp, ignore_errors=True)  # the trace files (each run rewrote them)
    result = {"preset": preset, "prompts": n, "prompt_len": [lo, hi], "output_len": out_len,
              "generated_tokens": n * out_len, "rounds": rounds, "threads": threads,
              "load_avg_1m": [round(x, 2) for x in loads], "spans_per_layers_run": spans_per_run,
              "steps_per_run": steps_per_run,
              "numerics_cost_us_per_decode_step": numerics_cost_us(preset, n), "modes": {}}
    for mode in MODES:
        entry = {}
        for k, kind in enumerate(("cpu", "wall")):
            runs_k = [t[k] for t in times[mode]]
            ratios = [t[k] / o[k] for t, o in zip(times[mode], times["off"])]
            entry[kind] = {"runs_s": [round(t, 4) for t in runs_k],
                           "median_s": round(statistics.median(runs_k), 4),
                           "paired_ratio_median": round(statistics.median(ratios), 4)}
        result["modes"][mode] = entry
    return result


def span_cost_ns(n: int = 200_000) -> dict:
    """CPU ns per recorded span (`with recorder.span(...)`), per untraced one (NULL_RECORDER)
    and per span written to the file (ChromeTraceWriter), medians of 5 batches of n."""
    from pagedllm.engine.trace_writer import ChromeTraceWriter
    from pagedllm.engine.tracing import NULL_RECORDER, SpanRecorder

    out = {}
    for label, rec in (("recorded", SpanRecorder(record=True)), ("untraced", NULL_RECORDER)):
        batches = []
        for _ in range(5):
            c0 = time.process_time()
            for _ in range(n):
                with rec.span("forward"):
                    pass
            batches.append((time.process_time() - c0) / n * 1e9)
            if label == "recorded":
                rec.drain()
        out[label] = round(statistics.median(batches), 1)
    rec = SpanRecorder(record=True)
    for _ in range(n // 10):
        with rec.span("forward"):
            pass
    events = rec.drain()
    batches = []
    with tempfile.TemporaryDirectory() as tmp:
        writer = ChromeTraceWriter(os.path.join(tmp, "w.json"), time.perf_counter_ns())
        for _ in range(5):
            c0 = time.process_time()
            writer.write(events)
            batches.append((time.process_time() - c0) / len(events) * 1e9)
        writer.close()
    out["written"] = round(statistics.median(batches), 1)
    return out


def numerics_cost_us(preset: str, rows: int, n: int = 2000) -> float:
    """CPU us per decode step of the numeric check alone: the probe's reductions over
    rows x hidden for every layer, its check, and the logits check of rows x vocab (median of
    5 batches of n)."""
    import torch

    from pagedllm.engine.layer_probe import NumericsProbe
    from pagedllm.engine.numerics import nonfinite_logit_rows
    from pagedllm.model.checkpoint import random_config

    cfg = random_config(preset)
    layers = cfg.num_hidden_layers
    probe = NumericsProbe(layers, torch.device("cpu"))
    x = torch.randn(rows, cfg.hidden_size)
    logits = torch.randn(rows, cfg.vocab_size)
    batches = []
    with torch.inference_mode():
        for _ in range(5):
            c0 = time.process_time()
            for _ in range(n):
                probe.start(rows)
                for i in range(-1, layers):
                    probe.after_layer(i, x)
                probe.faults(x)
                nonfinite_logit_rows(logits)
            batches.append((time.process_time() - c0) / n * 1e6)
    return round(statistics.median(batches), 1)


def table(results: list) -> str:
    lines = ["| model | mode | CPU median (s) | CPU vs off (paired median) | wall median (s) | "
             "wall vs off | CPU runs (s) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for res in results:
        for mode in MODES:
            cpu, wall = res["modes"][mode]["cpu"], res["modes"][mode]["wall"]
            deltas = ["-" if mode == "off" else f"{100 * (m['paired_ratio_median'] - 1):+.1f}%"
                      for m in (cpu, wall)]
            runs = ", ".join(f"{t:.3f}" for t in cpu["runs_s"])
            lines.append(f"| {res['preset']} | {mode} | {cpu['median_s']:.3f} | {deltas[0]} | "
                         f"{wall['median_s']:.3f} | {deltas[1]} | {runs} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", default="tiny,small")
    p.add_argument("--quick", action="store_true", help="smoke-sized workloads")
    p.add_argument("--out", default=os.path.join(HERE, "results", "diagnostics_cost.json"))
    args = p.parse_args(argv)
    results = [bench_model(m.strip(), args.rounds, args.threads, args.quick)
               for m in args.models.split(",") if m.strip()]
    payload = {"machine": common.machine_info(), "command": " ".join(sys.argv),
               "span_cost_ns": span_cost_ns(), "results": results}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(payload, f, indent=2)
    print(table(results))
    print(f"CPU ns per span: {payload['span_cost_ns']}")
    for res in results:
        step_us = res["modes"]["off"]["cpu"]["median_s"] / res["steps_per_run"] * 1e6
        spans = res["spans_per_layers_run"] / res["steps_per_run"]
        per_span = payload["span_cost_ns"]["recorded"] + payload["span_cost_ns"]["written"]
        print(f"{res['preset']}: {res['steps_per_run']} steps per run, {step_us:.0f} CPU us per "
              f"step; {spans:.1f} spans per step with layers "
              f"(~{spans * per_span / 1000:.1f} us recorded and written); numeric check "
              f"{res['numerics_cost_us_per_decode_step']} us per decode step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
