"""The figures of docs/BENCHMARKS.md, drawn from the JSON results (matplotlib, PNG).

    throughput_concurrency.png  output tokens/s against requests submitted at once, per model
    throughput_mixed.png        mixed-workload tokens/s per engine and model
    utilization.png             KV utilization per step over the run, paged vs contiguous
    block_size.png              block size sweep: tokens/s and waste, with the seed's rule
    sharing.png                 KV memory saved by parallel sampling and beam search

A figure whose JSON is missing is skipped (partial runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

COLORS = {"pagedllm": "#1f77b4", "vllm-cpu": "#d62728", "transformers": "#7f7f7f",
          "llama.cpp": "#2ca02c"}


def _load(out_dir: Path, name: str):
    path = out_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _twin_legend(ax, ax2, **kwargs) -> None:
    """One legend on `ax` for the lines of both y axes."""
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, **kwargs)


def throughput_concurrency(data: dict, path: Path) -> None:
    plt = _plt()
    models = list(data["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 3.8), squeeze=False)
    for ax, m in zip(axes[0], models):
        sweep = data["models"][m]["concurrency"]
        ns = sorted(int(n) for n in sweep)
        engines = list(dict.fromkeys(e for n in ns for e in sweep[str(n)] if e != "ratios"))
        for e in engines:
            # a peer may sit out some points (run on a subset): plot the points it ran
            pts = [(n, sweep[str(n)][e]["tokens_per_s"]) for n in ns if e in sweep[str(n)]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=e,
                    color=COLORS.get(e))
        u = data["models"][m]["uniform"]
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel(f"requests at once ({u['prompt_len']} prompt + {u['output_len']} output tokens)")
        ax.set_ylabel("output tokens / s")
        ax.set_title(f'"{m}" model')
        ax.grid(alpha=0.3)
        ax.legend()
    _save(plt, fig, path)


def throughput_mixed(data: dict, path: Path) -> None:
    plt = _plt()
    models = list(data["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 3.4), squeeze=False)
    for ax, m in zip(axes[0], models):
        med = data["models"][m]["mixed"]["median_tokens_per_s"]
        names = list(med)
        bars = ax.bar(names, [med[n] for n in names], color=[COLORS.get(n) for n in names])
        for b, n in zip(bars, names):
            ax.annotate(f"{med[n]:.0f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=9)
        w = data["models"][m]["mixed_workload"]
        ax.set_title(f'"{m}": {w["num_requests"]} mixed requests')
        ax.set_ylabel("output tokens / s")
        ax.grid(axis="y", alpha=0.3)
    _save(plt, fig, path)


def utilization(data: dict, path: Path) -> None:
    plt = _plt()
    u = data["utilization"]
    trace: List[list] = u["trace"]
    t = [r[0] for r in trace]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    series = (("paged (block %d)" % data["block_size"], 2, COLORS["pagedllm"]),
              ("contiguous, prompt + max_tokens", 4, "#ff7f0e"),
              ("contiguous, max_model_len", 5, "#7f7f7f"))
    for label, col, color in series:
        ax.plot(t, [100 * r[1] / r[col] if r[col] else None for r in trace], label=label,
                color=color, lw=1.2)
    ax.set_ylim(0, 102)
    ax.set_xlabel("time in the run (s)")
    ax.set_ylabel("tokens stored / slots reserved (%)")
    ax2 = ax.twinx()
    ax2.plot(t, [r[3] for r in trace], color="#2ca02c", lw=0.8, alpha=0.5, label="running requests")
    ax2.set_ylabel("running requests", color="#2ca02c")
    _twin_legend(ax, ax2, loc="lower right", fontsize=8)
    ax.set_title(f"KV utilization over the mixed workload ({data['workload']['num_requests']} requests)")
    ax.grid(alpha=0.3)
    _save(plt, fig, path)


def block_size(data: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ax2 = ax.twinx()
    styles = {"ample": "o-", "budget": "s--"}
    for pool, sweep in data["sweep"].items():
        bss = sorted(int(b) for b in sweep)
        label = "ample pool" if pool == "ample" else f"{data['budget_tokens']}-slot budget"
        ax.plot(bss, [sweep[str(b)]["tokens_per_s"] for b in bss], styles.get(pool, "o-"),
                color=COLORS["pagedllm"], label=f"tokens/s, {label}")
    sweep = data["sweep"]["ample"]
    bss = sorted(int(b) for b in sweep)
    ax2.plot(bss, [100 * sweep[str(b)]["waste"] for b in bss], "^:", color="#d62728",
             label="waste (%)")
    rule = data["seed_rule_block_size"]
    ax.axvline(rule, color="#888", ls=":", lw=1)
    ax.annotate(f"seed rule: {rule}", (rule, ax.get_ylim()[0]), xytext=(4, 6),
                textcoords="offset points", fontsize=8, color="#555")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bss, [str(b) for b in bss])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("output tokens / s")
    ax2.set_ylabel("KV waste (%)", color="#d62728")
    _twin_legend(ax, ax2, fontsize=8, loc="best")
    ax.set_title(f'Block size sweep, "{data["model"]}" model, mixed workload')
    ax.grid(alpha=0.3)
    _save(plt, fig, path)


def sharing(data: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    labels, vals, colors = [], [], []
    for kind, key, color in (("parallel sampling n=", "parallel_sampling", "#1f77b4"),
                             ("beam width ", "beam_search", "#9467bd")):
        for w, r in data[key].items():
            labels.append(f"{kind}{w}")
            vals.append(100 * r["saved_over_run"])
            colors.append(color)
    bars = ax.bar(labels, vals, color=colors)
    for b, v in zip(bars, vals):
        ax.annotate(f"{v:.0f}%", (b.get_x() + b.get_width() / 2, v), ha="center",
                    va="bottom", fontsize=9)
    ax.set_ylabel("KV blocks saved by sharing (%)")
    ax.set_ylim(0, 100)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("KV memory saved by copy-on-write sharing")
    _save(plt, fig, path)


def make_all(out_dir: Path) -> List[Path]:
    """Draws every figure whose JSON exists in out_dir; returns the files written."""
    out_dir = Path(out_dir)
    jobs = (("throughput", throughput_concurrency, "throughput_concurrency.png"),
            ("throughput", throughput_mixed, "throughput_mixed.png"),
            ("memory", utilization, "utilization.png"),
            ("block_size", block_size, "block_size.png"),
            ("sharing", sharing, "sharing.png"))
    written = []
    for name, fn, fname in jobs:
        data = _load(out_dir, name)
        if data is None:
            continue
        fn(data, out_dir / fname)
        written.append(out_dir / fname)
    return written
