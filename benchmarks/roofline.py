"""How close each engine's end-to-end runs come to this machine's floor, and so the largest
lead over a peer that any engine could show on them.

For a throughput results file (bench_throughput), every workload (mixed, uniform by
concurrency, long prompts) is rebuilt from its recorded generator and its work counted:

- FLOPs (2 per multiply-add): the layers' projections for every token that passes through the
  model (prompt tokens and fed-back output tokens: prompt + output - 1 per request), the
  lm_head for every generated token only, and causal attention (QK^T and PV: 4 x query heads x
  head_dim per (query, key) pair, key positions 0..t for the token at position t);
- bytes: every step reads every weight once (the weights are far larger than the caches), and
  a request of o output tokens needs at least o steps, so the longest request's output length
  times the weight bytes must be streamed.

The floor of a run is the larger of compute / peak FLOP rate and weight bytes / read bandwidth
(both lower bounds, so their maximum is one too), with the rates measured here: the peak is the
faster of a 2048^3 torch.mm and pagedllm's packed GEMM at 1024 x 2048 x 2048 (all threads,
median of rounds), the bandwidth `_core.stream_read_sum` over 1 GiB. An engine at its floor has
nothing left to gain without doing less work (fewer FLOPs or fewer bytes: quantized weights,
speculative decoding, prefix reuse); a peer at fraction f of the floor can be beaten by at most
1 / f by anyone.

The rates are this machine's at the time of the call: give --peak-gflops / --bandwidth-gbs
measured beside the benchmark run when the results come from another time.

Usage: PYTHONPATH=.:python python -m benchmarks.roofline RESULTS.json [RESULTS.json ...]
       [--out benchmarks/results/roofline.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional

import torch

from benchmarks.common import median_time
from benchmarks.workloads import (MIXED, BenchRequest, long_prompt_workload, mixed_workload,
                                  uniform_workload)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def workload_flops(cfg, reqs: List[BenchRequest]) -> Dict[str, float]:
    """FLOPs a workload needs on a model (see the module docstring for what is counted).

    Args:
        cfg: the pagedllm ModelConfig.
        reqs: the requests (prompt ids and forced output lengths).
    Returns:
        {"projections", "lm_head", "attention", "total"} in FLOPs.
    """
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    embedding = cfg.vocab_size * h
    # parameters the layers multiply by (norm weights are a rounding error next to them)
    layer_params = cfg.num_parameters() - embedding - (0 if cfg.tie_word_embeddings else embedding)
    per_pair = 4 * cfg.num_attention_heads * cfg.head_dim * layers  # one (query, key) pair
    proj = head = attn = 0.0
    for r in reqs:
        p, o = len(r.prompt_token_ids), r.max_tokens
        tokens = p + o - 1                        # every position fed through the layers
        proj += 2.0 * layer_params * tokens
        head += 2.0 * embedding * o               # logits of each generated token
        attn += per_pair * tokens * (tokens + 1) / 2  # position t attends to t + 1 keys
    return {"projections": proj, "lm_head": head, "attention": attn,
            "total": proj + head + attn}


def weight_bytes(cfg, dtype: str) -> int:
    """Bytes of every weight the model reads in a step (a tied matrix counted once)."""
    return cfg.num_parameters() * _DTYPES[dtype].itemsize


def floor_s(cfg, reqs: List[BenchRequest], dtype: str, peak_flops: float,
            bandwidth: float) -> Dict[str, float]:
    """The run's lower bounds in seconds.

    Args:
        cfg, reqs: as workload_flops.
        dtype: "float32" or "bfloat16" (weight bytes).
        peak_flops: FLOP/s of this machine's fastest GEMM in that dtype.
        bandwidth: bytes/s of one read pass over DRAM.
    Returns:
        {"compute_s", "stream_s", "floor_s", "bound": "compute" or "bandwidth"}.
    """
    compute = workload_flops(cfg, reqs)["total"] / peak_flops
    steps = max(r.max_tokens for r in reqs)
    stream = steps * weight_bytes(cfg, dtype) / bandwidth
    return {"compute_s": compute, "stream_s": stream, "floor_s": max(compute, stream),
            "bound": "compute" if compute >= stream else "bandwidth"}


def peak_flops(dtype: str, rounds: int = 5) -> Dict[str, float]:
    """FLOP/s of this machine's GEMMs in dtype, every thread: a 2048^3 torch.mm and pagedllm's
    packed GEMM at 1024 rows of a 2048 x 2048 weight (where `_core.linear` runs).

    Returns:
        {"torch_mm", "pagedllm" (0 when absent), "peak": the larger}.
    """
    dt = _DTYPES[dtype]
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2048, 2048, generator=g).to(dt)
    b = torch.randn(2048, 2048, generator=g).to(dt)
    flops = 2.0 * 2048 ** 3
    out = {"torch_mm": flops / median_time(lambda: torch.mm(a, b), rounds), "pagedllm": 0.0}
    try:
        from pagedllm.model import packed_linear

        w = packed_linear.pack(b, "pagedllm")
        x = a[:1024].contiguous()
        out["pagedllm"] = flops / 2 / median_time(lambda: packed_linear.linear(x, w, None), rounds)
    except (ImportError, ValueError):
        pass
    out["peak"] = max(out["torch_mm"], out["pagedllm"])
    return out


def read_bandwidth(rounds: int = 5) -> float:
    """Bytes/s of `_core.stream_read_sum` over 1 GiB, every thread (median)."""
    from pagedllm import _core

    buf = torch.ones(1 << 28)
    return buf.numel() * 4 / median_time(lambda: _core.stream_read_sum(buf), rounds)


def _workloads(model: dict, vocab: int) -> Dict[str, List[BenchRequest]]:
    """The workloads of one model's results, rebuilt from their recorded generators."""
    gen = dict(MIXED, **model["mixed_workload"]["generator"])
    out = {"mixed": mixed_workload(vocab=vocab, seed=0, **gen)}
    p_len, o_len = model["uniform"]["prompt_len"], model["uniform"]["output_len"]
    for n in model["concurrency"]:
        out[f"{n} at once"] = uniform_workload(int(n), vocab, p_len, o_len, seed=1000 + int(n))
    n, lo, hi, o = model["long_prompt"]["generator"]
    out["long prompts"] = long_prompt_workload(n, vocab, lo, hi, o, seed=7)
    return out


def _elapsed(model: dict, name: str) -> Dict[str, float]:
    """Median elapsed seconds per engine of one workload."""
    if name == "mixed":
        runs = model["mixed"]["runs"]
    elif name == "long prompts":
        runs = model["long_prompt"]["runs"]
    else:
        point = model["concurrency"][name.split()[0]]
        return {k: v["elapsed_s"] for k, v in point.items() if k != "ratios"}
    return {k: statistics.median(r["elapsed_s"] for r in v) for k, v in runs.items()}


def analyse(results: dict, peak: float, bandwidth: float) -> List[dict]:
    """One row per (model, workload) of a throughput results file.

    Args:
        results: the JSON bench_throughput wrote.
        peak: FLOP/s (the dtype of the run); bandwidth: bytes/s.
    Returns:
        Rows with the work, the floor, each engine's seconds and fraction of the floor, and the
        largest ratio over each peer that an engine at the floor would show.
    """
    from pagedllm.model.checkpoint import random_config

    rows = []
    for preset, model in results["models"].items():
        cfg = random_config(preset)
        dtype = model["pagedllm_config"]["dtype"]
        for name, reqs in _workloads(model, cfg.vocab_size).items():
            fl = workload_flops(cfg, reqs)
            floor = floor_s(cfg, reqs, dtype, peak, bandwidth)
            secs = _elapsed(model, name)
            rows.append({
                "model": preset, "dtype": dtype, "workload": name,
                "tflop": round(fl["total"] / 1e12, 3),
                "attention_share": round(fl["attention"] / fl["total"], 3),
                **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in floor.items()},
                "elapsed_s": {k: round(v, 3) for k, v in secs.items()},
                "fraction_of_floor": {k: round(floor["floor_s"] / v, 3) for k, v in secs.items()},
                "largest_possible_ratio": {f"over {k}": round(v / floor["floor_s"], 2)
                                           for k, v in secs.items() if k != "pagedllm"},
            })
    return rows


def _print(rows: List[dict]) -> None:
    print(f"{'model':6} {'dtype':9} {'workload':13} {'TFLOP':>7} {'attn':>5} {'bound':>9} "
          f"{'floor s':>8} {'pagedllm':>15} {'vLLM CPU':>15} {'max lead':>8}")
    for r in rows:
        e, f = r["elapsed_s"], r["fraction_of_floor"]
        peer = "vllm-cpu" if "vllm-cpu" in e else next((k for k in e if k != "pagedllm"), None)
        cell = (lambda k: f"{e[k]:7.2f}s {f[k]:5.0%}" if k in e else "-")
        lead = r["largest_possible_ratio"].get(f"over {peer}", float("nan"))
        print(f"{r['model']:6} {r['dtype']:9} {r['workload']:13} {r['tflop']:7.2f} "
              f"{r['attention_share']:5.0%} {r['bound']:>9} {r['floor_s']:8.2f} "
              f"{cell('pagedllm'):>15} {cell(peer) if peer else '-':>15} {lead:7.2f}x")


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="throughput results JSON files")
    ap.add_argument("--peak-gflops", type=float, default=None,
                    help="GEMM peak to use (default: measured now, per dtype)")
    ap.add_argument("--bandwidth-gbs", type=float, default=None,
                    help="read bandwidth to use (default: measured now)")
    ap.add_argument("--out", default=None, help="write the rows and the rates as JSON")
    a = ap.parse_args(argv)
    bandwidth = a.bandwidth_gbs * 1e9 if a.bandwidth_gbs else read_bandwidth()
    peaks: Dict[str, dict] = {}
    rows: List[dict] = []
    for path in a.results:
        results = json.loads(Path(path).read_text())
        dtype = next(iter(results["models"].values()))["pagedllm_config"]["dtype"]
        if dtype not in peaks:
            peaks[dtype] = ({"peak": a.peak_gflops * 1e9} if a.peak_gflops
                            else peak_flops(dtype))
        for row in analyse(results, peaks[dtype]["peak"], bandwidth):
            rows.append({"source": Path(path).name, **row})
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; GEMM peak "
          + ", ".join(f"{d} {p['peak'] / 1e9:.0f} GFLOP/s" for d, p in peaks.items()))
    _print(rows)
    if a.out:
        from benchmarks.common import machine_info

        Path(a.out).write_text(json.dumps({
            "machine": machine_info(), "bandwidth_bytes_per_s": bandwidth,
            "peak_flops": peaks, "rows": rows}, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
