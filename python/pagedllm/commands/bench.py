"""Benchmark the engine on a synthetic or given workload.

Synthetic (default): --num-prompts random-token prompts of --input-len tokens, each generating
--output-len tokens (EOS ignored), lengths optionally spread log-normally. --file instead reads
JSON Lines {"prompt": text or token ids, "max_tokens": N}. Requests arrive all at once, or as a
Poisson process with --request-rate. Reports throughput, time-to-first-token, time per output
token and end-to-end latency percentiles, KV-cache usage sampled at every step, preemptions and
prefix-cache hits; --json writes the same figures.

examples:
  pagedllm bench --num-prompts 64 --input-len 128 --output-len 64
  pagedllm bench --file workload.jsonl --request-rate 4 --json results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Dict, List

from pagedllm.commands import HELPS
from pagedllm.commands.bench_workload import (BenchRequest, assign_arrivals, from_file,
                                              percentiles, synthetic)
from pagedllm.commands.common import (CliError, UsageError, add_engine_args, add_trace_arg,
                                      build_engine, check_output_file, end_run, engine_config,
                                      is_length_error, length_fix, make_sampling_params,
                                      positive_int, report_failures, request_failure,
                                      start_trace)
from pagedllm.commands.stats_file import add_stats_file_arg, check_stats_file, open_stats_file

NAME = "bench"
HELP = HELPS[NAME]


def add_arguments(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("workload")
    w.add_argument("--num-prompts", type=positive_int, default=64, metavar="N", help="requests (64)")
    w.add_argument("--input-len", type=positive_int, default=128, metavar="N",
                   help="prompt tokens, median (128)")
    w.add_argument("--output-len", type=positive_int, default=64, metavar="N",
                   help="generated tokens, median (64)")
    w.add_argument("--input-len-spread", type=float, default=0.0, metavar="SIGMA",
                   help="log-normal spread of prompt lengths (0: all equal)")
    w.add_argument("--output-len-spread", type=float, default=0.0, metavar="SIGMA",
                   help="log-normal spread of output lengths (0: all equal)")
    w.add_argument("--file", metavar="FILE.jsonl",
                   help="workload of {prompt, max_tokens} lines instead of the synthetic one")
    w.add_argument("--request-rate", type=float, default=math.inf, metavar="R",
                   help="Poisson arrivals, requests/s (default: all at once)")
    w.add_argument("--temperature", type=float, default=1.0, metavar="T", help="sampling (1.0)")
    w.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly max_tokens (on)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_stats_file_arg(o)
    add_trace_arg(o)
    add_engine_args(p)


def _check_workload_flags(args) -> None:
    """Raises UsageError on a bad workload or sampling flag (before the model is loaded)."""
    for flag in ("input_len_spread", "output_len_spread"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"--{flag.replace('_', '-')} must be a finite number >= 0, got "
                             f"{value} (0: all lengths equal)")
    if not args.request_rate > 0:
        raise UsageError(f"--request-rate must be > 0, got {args.request_rate} (leave it out to "
                         "send every request at once)")
    make_sampling_params(dict(temperature=args.temperature, max_tokens=args.output_len,
                              ignore_eos=args.ignore_eos), {"--max-tokens": "--output-len"})


def _workload(args, engine) -> List[BenchRequest]:
    vocab = engine.model_config.vocab_size
    avoid = set(engine.eos_token_ids)
    if engine.tokenizer is not None and engine.tokenizer.bos_token_id is not None:
        avoid.add(engine.tokenizer.bos_token_id)
    return synthetic(args.num_prompts, args.input_len, args.output_len, args.input_len_spread,
                     args.output_len_spread, vocab, avoid, engine.config.seed)


def _request_error(args, engine, index: int, request: BenchRequest,
                   message: str) -> UsageError:
    """The usage error of a request the engine refused: a line of --file names that line."""
    from pagedllm.engine.llm_engine import without_request_id

    message = without_request_id(message)
    if request.line is None:
        return UsageError(f"request {index}: {message} "
                          f"({length_fix(engine, 'lower --input-len / --output-len')})")
    fix = (length_fix(engine, "shorten that request") if is_length_error(message)
           else "fix that line of --file")
    return UsageError(f"{args.file}:{request.line}: {message} ({fix})")


def run(args: argparse.Namespace) -> int:
    config = engine_config(args)
    _check_workload_flags(args)
    check_output_file(args.json, "--json")
    check_stats_file(args)
    file_requests = from_file(args.file, args.output_len) if args.file else None
    from tqdm.auto import tqdm

    from pagedllm.sampling_params import SamplingParams

    engine = build_engine(config)
    reqs = file_requests or _workload(args, engine)
    assign_arrivals(reqs, args.request_rate, engine.config.seed)
    start_trace(engine, args)
    stats = None
    samples: List[tuple] = []
    engine.on_step = lambda s: samples.append((s["used_blocks"] / max(1, s["num_blocks"]),
                                               s["utilization"]))
    finished: Dict[str, object] = {}
    unfinished = set()
    bar = tqdm(total=len(reqs), desc="bench", unit="req", disable=True if args.no_progress else None,
               file=sys.stderr, dynamic_ncols=True)
    start = time.monotonic()
    nxt = 0
    try:
        stats = open_stats_file(engine, args)
        while nxt < len(reqs) or engine.has_unfinished_requests():
            now = time.monotonic() - start
            while nxt < len(reqs) and reqs[nxt].arrival <= now:
                r = reqs[nxt]
                try:
                    params = SamplingParams(temperature=args.temperature, max_tokens=r.max_tokens,
                                            ignore_eos=args.ignore_eos)
                    rid = engine.add_request(f"bench-{nxt}", r.prompt, params,
                                             arrival_time=start + r.arrival)
                except ValueError as e:
                    raise _request_error(args, engine, nxt, r, str(e)) from None
                unfinished.add(rid)
                nxt += 1
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, reqs[nxt].arrival - (time.monotonic() - start)))
                continue
            outs = engine.step()
            for out in outs:
                if out.finished:
                    finished[out.request_id] = out
                    unfinished.discard(out.request_id)
                    bar.update(1)
            if stats is not None:
                stats.after_step(outs)
    finally:
        bar.close()
        end_run(engine, stats, unfinished)  # also on an error or Ctrl-C
    duration = time.monotonic() - start
    results = summarize(list(finished.values()), duration, samples, engine.kv_cache_stats())
    results["workload"] = {
        "source": args.file or "synthetic", "num_prompts": len(reqs),
        "input_len": None if args.file else args.input_len,
        "output_len": None if args.file else args.output_len,
        "input_len_spread": args.input_len_spread, "output_len_spread": args.output_len_spread,
        "request_rate": None if math.isinf(args.request_rate) else args.request_rate,
        "temperature": args.temperature, "ignore_eos": args.ignore_eos}
    results["engine"] = dataclasses.asdict(engine.config)
    results["engine"]["model"] = engine.model_path
    print(format_results(results))
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(results, f, indent=2)
        except OSError as e:
            raise CliError(f"cannot write {args.json!r}: {e.strerror} (check --json)") from None
    return report_failures({f"request {rid}": why for rid, out in finished.items()
                            if (why := request_failure(out)) is not None})


def summarize(outputs: list, duration: float, samples: List[tuple], kv: dict) -> dict:
    """The figures of a finished run (see the module docstring)."""
    ttft, tpot, e2e = [], [], []
    prompt_tokens = output_tokens = 0
    for out in outputs:
        m = out.metrics
        n = sum(len(c.token_ids) for c in out.outputs)
        prompt_tokens += len(out.prompt_token_ids)
        output_tokens += n
        first = m.get("first_token_time", m["arrival_time"])
        end = m.get("finish_time", first)
        ttft.append(first - m["arrival_time"])
        e2e.append(end - m["arrival_time"])
        if n > 1:
            tpot.append((end - first) / (n - 1))
    usage = [u for u, _ in samples]
    fill = [f for _, f in samples]
    queries = kv.get("prefix_cache_queries", 0)
    return {
        "num_requests": len(outputs), "duration_s": duration,
        "num_failed": sum(request_failure(out) is not None for out in outputs),
        "requests_per_s": len(outputs) / duration if duration > 0 else 0.0,
        "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / duration if duration > 0 else 0.0,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / duration if duration > 0 else 0.0,
        "ttft_ms": percentiles(ttft, 1e3), "tpot_ms": percentiles(tpot, 1e3),
        "e2e_latency_s": percentiles(e2e),
        "kv_cache_usage": {"mean": sum(usage) / len(usage) if usage else 0.0,
                           "peak": kv.get("peak_used_blocks", 0) / max(1, kv.get("num_blocks", 1))},
        "kv_slot_fill_mean": sum(fill) / len(fill) if fill else 0.0,
        "kv_num_blocks": kv.get("num_blocks", 0), "num_steps": len(samples),
        "num_preemptions": kv.get("num_preemptions", 0),
        "prefix_cache_hit_rate": kv.get("prefix_cache_hits", 0) / queries if queries else 0.0,
    }


def format_results(r: dict) -> str:
    """The figures as an aligned text table."""
    def pct(d: dict, unit: str, fmt: str = "{:.1f}") -> str:
        return "  ".join(f"{k} {fmt.format(d[k])}" for k in ("p50", "p90", "p99")) + \
            f"  mean {fmt.format(d['mean'])} {unit}"

    rows = [
        ("requests", f"{r['num_requests']} in {r['duration_s']:.2f} s "
                     f"({r['requests_per_s']:.2f} req/s, {r['num_steps']} steps)"
                     + (f", {r['num_failed']} failed (counted in every figure)"
                        if r.get("num_failed") else "")),
        ("tokens", f"{r['prompt_tokens']} prompt, {r['output_tokens']} generated"),
        ("throughput", f"{r['output_tokens_per_s']:.1f} output tok/s, "
                       f"{r['total_tokens_per_s']:.1f} total tok/s"),
        ("TTFT", pct(r["ttft_ms"], "ms")),
        ("TPOT", pct(r["tpot_ms"], "ms")),
        ("latency", pct(r["e2e_latency_s"], "s", "{:.3f}")),
        ("KV cache usage", f"mean {100 * r['kv_cache_usage']['mean']:.1f}%, peak "
                           f"{100 * r['kv_cache_usage']['peak']:.1f}% of {r['kv_num_blocks']} "
                           f"blocks (slot fill {100 * r['kv_slot_fill_mean']:.1f}%)"),
        ("preemptions", str(r["num_preemptions"])),
        ("prefix cache", f"{100 * r['prefix_cache_hit_rate']:.1f}% of prompt tokens hit"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
