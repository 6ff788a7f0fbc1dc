"""The fused element-wise kernels against the torch expressions they replace, per call.

For each op (residual add + RMSNorm, SiLU-and-mul, RoPE on q and k) and each shape (the
"tiny" and "small" presets at decode batches and a 512-token prefill), the median main-thread
CPU time of one call of the eager torch expression of pagedllm.model.llama before the fused
kernels, and of the `_core` kernel. CPU time, not wall time, so that other jobs on a shared
machine weigh less; one thread (torch and the kernel pool) unless --threads.

Usage: PYTHONPATH=.:python python -m benchmarks.bench_fused_ops [--threads 1] [--repeats 200]
Writes benchmarks/results/fused_ops.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from benchmarks.common import machine_info, write_results
from pagedllm import _core
from pagedllm.model.checkpoint import random_config

# (preset, rows): decode batches of the end-to-end points and one prefill chunk
SHAPES = (("tiny", 64), ("tiny", 512), ("small", 16), ("small", 512))


def cpu_us(fn: Callable[[], object], repeats: int) -> float:
    """Median thread CPU time of fn() in microseconds (after a warm-up)."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) / 1e3


def _torch_norm(x, delta, w, eps):
    x += delta
    out = torch.empty_like(x)
    _core.rms_norm(out, x, w, eps)  # the C++ norm the model already had, after torch's add
    return out


def _torch_silu(gate_up, f):
    gate, up = gate_up.split(f, dim=-1)
    return torch.mul(F.silu(gate, inplace=True), up)


def _torch_rope(qk, cos, sin):
    t, n, d = qk.shape
    swapped = qk.reshape(t, n, 2, d // 2).flip(2).reshape(t, n, d)
    out = qk * cos
    out += swapped * sin
    return out


def measure(preset: str, rows: int, dtype: torch.dtype, repeats: int) -> Dict[str, Dict[str, float]]:
    """{op: {"torch_us", "fused_us"}} for one shape."""
    cfg = random_config(preset)
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    heads = cfg.num_attention_heads + cfg.num_key_value_heads
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, h, generator=g).to(dtype)
    delta = torch.randn(rows, h, generator=g).to(dtype)
    w = torch.randn(h, generator=g).to(dtype)
    out = torch.empty_like(x)
    gate_up = torch.randn(rows, 2 * f, generator=g).to(dtype)
    act = torch.empty(rows, f, dtype=dtype)
    qkv = torch.randn(rows, (heads + cfg.num_key_value_heads) * d, generator=g).to(dtype)
    qk = qkv[:, :heads * d].view(rows, heads, d)
    cos = torch.randn(rows, 1, d, generator=g).to(dtype)
    sin = torch.randn(rows, 1, d, generator=g).to(dtype)
    res = {}
    if dtype == torch.float32:  # the model's torch path for bf16 norms was 6 ops: not timed here
        res["add + RMSNorm"] = {
            "torch_us": cpu_us(lambda: _torch_norm(x, delta, w, 1e-5), repeats),
            "fused_us": cpu_us(lambda: _core.fused_add_rms_norm(out, x, delta, w, 1e-5), repeats)}
    res["SiLU-and-mul"] = {
        "torch_us": cpu_us(lambda: _torch_silu(gate_up.clone(), f), repeats)
        - cpu_us(lambda: gate_up.clone(), repeats),
        "fused_us": cpu_us(lambda: _core.silu_and_mul(act, gate_up), repeats)}
    res["RoPE (q and k)"] = {
        "torch_us": cpu_us(lambda: _torch_rope(qk, cos, sin), repeats),
        "fused_us": cpu_us(lambda: _core.rotary_embedding(qk, cos, sin), repeats)}
    return res


def run(threads: int = 1, repeats: int = 200, dtypes=("float32", "bfloat16")) -> dict:
    """Measures every op, shape and dtype; returns (and writes) the figures."""
    torch.set_num_threads(threads)
    _core.set_num_threads(threads)
    rows: List[dict] = []
    for dt in dtypes:
        for preset, n in SHAPES:
            for op, r in measure(preset, n, getattr(torch, dt), repeats).items():
                rows.append({"op": op, "dtype": dt, "model": preset, "rows": n,
                             "torch_us": round(r["torch_us"], 2), "fused_us": round(r["fused_us"], 2)})
    out = {"benchmark": "fused_ops", "threads": threads, "repeats": repeats,
           "engine": _core.get_cpu_engine(), "rows": rows, "machine": machine_info()}
    write_results("fused_ops", out)
    return out


def markdown(r: dict) -> str:
    """The figures as a markdown table."""
    lines = ["| op | dtype | shape | torch expression µs | fused µs | speed-up |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    for x in r["rows"]:
        lines.append(f"| {x['op']} | {x['dtype']} | {x['model']} x {x['rows']} | "
                     f"{x['torch_us']:.1f} | {x['fused_us']:.1f} | "
                     f"{x['torch_us'] / max(x['fused_us'], 1e-3):.1f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    print(markdown(run(a.threads, a.repeats)))


if __name__ == "__main__":
    main()
