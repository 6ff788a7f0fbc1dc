"""Markdown renderers of the worker-redesign sections (issue 12): preemption (swap vs
recompute), dtype (bf16 vs fp32 weights) and the engine's per-step overhead before/after."""

from __future__ import annotations

from benchmarks.report_sections import (Context, _workload_line, f0, pct, provenance, ratio,
                                        table)


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def preemption(data: dict, ctx: Context) -> str:
    out = []
    for model, d in data["models"].items():
        rows = []
        for bs, v in d["block_sizes"].items():
            r, s, q = v["recompute"], v["swap"], v["swap_over_recompute"]
            rows.append([model, bs, f0(r["tokens_per_s"]), f0(s["tokens_per_s"]),
                         ratio(q["tokens_per_s"]),
                         f"{_s(r['latency_p50_s'])} / {_s(r['latency_p99_s'])}",
                         f"{_s(s['latency_p50_s'])} / {_s(s['latency_p99_s'])}",
                         ratio(q["latency_p99_s"]), f0(r["preemptions"]),
                         f"{f0(s['preemptions'])} ({f0(s['swap_outs'])} / {f0(s['swap_ins'])})",
                         f"{1e3 * s['transfer_s']:.0f}", "yes" if v["same_tokens"] else "no"])
        out += [f"**{model}**: " + _workload_line(d["workload"]) + f" Demand "
                f"{d['demand_tokens']:,} KV slots against a pool of {data['pool_tokens']:,} "
                f"(the same slots at every block size); host swap pool "
                f"{1024 * d['swap_space_gib']:.0f} MiB.", "",
                table(["model", "block", "recompute tok/s", "swap tok/s", "swap / recompute",
                       "recompute P50 / P99 s", "swap P50 / P99 s", "P99 swap / recompute",
                       "recompute preemptions", "swap preemptions (outs / ins)",
                       "swap transfer ms", "same tokens"], rows), ""]
    out.insert(0, f"All requests added at once, greedy, outputs forced to their lengths, prefix "
                  f"caching off; a fresh engine per run; medians of {data['repeats']} rounds, "
                  f"the two modes back to back in alternating order, ratios per round then "
                  f"their median. Latency = finish - arrival of each request. \"swap transfer "
                  f"ms\" = wall time of the worker's transfers before the forward (swap-outs "
                  f"and swap-ins: copies within the same RAM on the CPU).\n")
    return "\n".join(out) + "\n" + provenance(data, ctx, "preemption")


def dtype(data: dict, ctx: Context) -> str:
    rows = []
    for model, d in data["models"].items():
        for kind in ("decode", "prefill"):
            v = d[kind]
            shape = (f"{v['sequences']} x ({v['prompt_tokens']} + {v['output_tokens']})")
            a = v["agreement"]
            rows.append([model, f"{kind}-bound: {shape}", v["unit"],
                         f0(v["float32"]["tokens_per_s"]), f0(v["bfloat16"]["tokens_per_s"]),
                         ratio(v["bf16_over_fp32"]), pct(a["first_token_identical"]),
                         a["mean_identical_prefix_of_8"] if kind == "decode" else "-"])
    flags = data.get("cpu_flags", {})
    have = ", ".join(f for f, on in flags.items() if on) or "?"
    lack = ", ".join(f for f, on in flags.items() if not on) or "none"
    return "\n".join([
        f"Same requests, two engines in one process (`dtype=\"float32\"` and "
        f"`dtype=\"bfloat16\"`, KV cache dtype auto = the model's), alternating, medians of "
        f"{data['repeats']} rounds; the ratio is taken per round. Agreement: share of requests "
        f"whose first greedy token is the same in bf16 as in fp32, and the mean identical "
        f"prefix of the first 8 generated tokens. CPU flags present: {have}; absent: {lack}.",
        "", table(["model", "workload (seqs x (prompt + output))", "unit", "fp32", "bf16",
                   "bf16 / fp32", "first token identical", "identical prefix of 8"], rows),
        "", provenance(data, ctx, "dtype")])


def step_overhead(data: dict, ctx: Context) -> str:
    rows = []
    for b, t in data["batches"].items():
        bf, af = t["before"], t["after"]
        rows.append([b, f"{bf['overhead_cpu_ms']:.2f}", f"{af['overhead_cpu_ms']:.2f}",
                     ratio(t["after_over_before_cpu"]), f"{bf['overhead_ms']:.2f}",
                     f"{af['overhead_ms']:.2f}", f"{bf['forward_ms']:.2f}",
                     f"{af['forward_ms']:.2f}",
                     f"{1e3 * af['overhead_cpu_ms'] / int(b):.0f}"])
    m = data.get("machine", {})
    loads = data.get("load_avg_1m_per_run", [])
    return "\n".join([
        f"`bench_step_overhead.py` (\"tiny\", decode steps of a batch, prompts of 32 tokens, 48 "
        f"steps x 3 runs per batch, {data.get('threads') or 'all'} thread(s)) on the engine of "
        f"commit `{data['before_commit']}` (before) and of "
        f"{'commit `' + data['after_commit'] + '`' if data.get('after_commit') else 'this checkout'} "
        f"(after), "
        f"alternately in fresh processes, {data['rounds']} rounds; medians over the rounds. "
        f"Engine time = step minus model forward, in main-thread CPU time (what other jobs take "
        f"is left out) and in wall time.", "",
        table(["batch", "engine CPU ms before", "after", "after / before", "engine wall ms "
               "before", "after", "forward ms before", "after", "after µs CPU per seq"], rows),
        "", f"_Script: `python -m benchmarks.step_overhead_ab --rounds {data['rounds']}"
            + (f" --threads {data['threads']}" if data.get("threads") else "")
            + f"`; machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores; date "
              f"{m.get('date', '?')}; 1-min load average {min(loads, default=0):.1f}-"
              f"{max(loads, default=0):.1f} over the runs._"]
        + (["", _chain(ctx.load("step_overhead_chain"))] if ctx.load("step_overhead_chain") else []))


def _chain(data: dict) -> str:
    """The per-commit table of a --chain run: engine CPU ms per step, each commit's change."""
    commits = data["commits"]
    rows = []
    for b, t in data["batches"].items():
        row = [b]
        base = t[commits[0]]["overhead_cpu_ms"]
        for i, c in enumerate(commits):
            v = t[c]["overhead_cpu_ms"]
            row.append(f"{v:.2f}" + (f" ({v / base:.2f}x)" if i else ""))
        rows.append(row)
    loads = data.get("load_avg_1m_per_run", [])
    return "\n".join([
        f"Commit by commit (every commit since the baseline that touches the engine, the model, "
        f"ops or the sampling parameters, in history order, whatever branch they are on; engine "
        f"CPU ms per step, in brackets the ratio to the first commit; {data['rounds']} rounds, order rotated, medians; load "
        f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f}):", "",
        table(["batch"] + [f"`{c}`" for c in commits], rows), "",
        f"_Script: `python -m benchmarks.step_overhead_ab --chain {','.join(commits)} --rounds "
        f"{data['rounds']}" + (f" --threads {data['threads']}" if data.get("threads") else "")
        + f" --name step_overhead_chain`._"])
