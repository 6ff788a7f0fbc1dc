"""pagedllm's packed linear kernel against oneDNN's prepacked one, in one process.

For each projection shape of the "tiny" and "small" presets ([out, in] of qkv, o_proj, gate_up,
down, lm_head), each dtype (float32, bfloat16) and each row count (decode batches to a prefill
chunk), the wall time of `packed_linear.linear` with the weight packed by each backend. Weights
are cycled through enough copies that they do not fit in the last-level cache (--bytes; the
"small" model's 0.5 GB of fp32 weights do not either), so each call reads its weight from
memory as in a real decode step. The two backends alternate in every round, on the same
threads: the kernels run on torch's OpenMP team, as in the engine (pagedllm.threads). Medians
of --rounds rounds; the weight bytes per second are reported next to the machine's read
bandwidth measured in the same run (`_core.stream_read_sum`, 2 x 1 GiB passes).

Usage: PYTHONPATH=.:python python -m benchmarks.bench_linear [--rows 1,16,64,512] [--rounds 5]
       ... --isa avx2 --dtypes float32   (an AVX2-only CPU, emulated: oneDNN has no bf16 GEMM there)
Writes benchmarks/results/linear.json (linear_<isa>.json when emulated; or --out) and prints a
table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch

from benchmarks import isa
from benchmarks.common import machine_info
from pagedllm import _core, threads
from pagedllm.model import packed_linear
from pagedllm.model.checkpoint import random_config


def projection_shapes(preset: str) -> Dict[str, tuple]:
    """[out_features, in_features] of each projection of a preset (qkv and gate_up fused)."""
    c = random_config(preset)
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    h, f = c.hidden_size, c.intermediate_size
    return {"qkv": (q + 2 * kv, h), "o_proj": (h, q), "gate_up": (2 * f, h), "down": (h, f),
            "lm_head": (c.vocab_size, h)}


def read_bandwidth() -> float:
    """GB/s of one read pass over 1 GiB by all kernel threads (the faster of two)."""
    x = torch.ones(1 << 28)
    best = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        _core.stream_read_sum(x)
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return best


def time_shape(n: int, k: int, dtype: torch.dtype, rows: List[int], rounds: int,
               total_bytes: float) -> List[dict]:
    """Both backends on one weight shape (copies cycled) at every row count."""
    g = torch.Generator().manual_seed(n * 31 + k)
    copies = max(1, int(total_bytes // (n * k * torch.finfo(dtype).bits // 8)))
    weights = [(torch.randn(n, k, generator=g) * 0.03).to(dtype) for _ in range(copies)]
    packs = {b: [packed_linear.pack(w, b) for w in weights] for b in packed_linear.BACKENDS}
    del weights
    out = []
    for m in rows:
        x = torch.randn(m, k, generator=g).to(dtype)
        for b in packed_linear.BACKENDS:  # warm-up: oneDNN builds its primitive here
            packed_linear.linear(x, packs[b][0], None)
        times = {b: [] for b in packed_linear.BACKENDS}
        for _ in range(rounds):
            for b in packed_linear.BACKENDS:
                t0 = time.perf_counter()
                for p in packs[b]:
                    packed_linear.linear(x, p, None)
                times[b].append((time.perf_counter() - t0) / copies)
        ms = {b: statistics.median(v) * 1e3 for b, v in times.items()}
        weight_bytes = n * k * torch.finfo(dtype).bits // 8
        out.append(dict(out_features=n, in_features=k, rows=m, copies=copies,
                        pagedllm_ms=ms["pagedllm"], onednn_ms=ms["onednn"],
                        speedup=ms["onednn"] / ms["pagedllm"],
                        pagedllm_weight_gbs=weight_bytes / ms["pagedllm"] / 1e6,
                        onednn_weight_gbs=weight_bytes / ms["onednn"] / 1e6,
                        pagedllm_gflops=2 * m * n * k / ms["pagedllm"] / 1e6,
                        onednn_gflops=2 * m * n * k / ms["onednn"] / 1e6))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rows", default="1,4,16,64,256,1024")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bytes", type=float, default=96e6,
                    help="weight bytes cycled per shape (above the last-level cache)")
    ap.add_argument("--threads", type=int, default=None, help="default: every CPU")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/linear.json, "
                    "linear_<isa>.json under an emulated instruction set")
    ap.add_argument("--isa", default="native", choices=isa.ISAS,
                    help="instruction set both backends are held to (benchmarks/isa.py)")
    args = ap.parse_args()
    isa.emulate(args.isa)  # re-executes this command under the ISA's variables where needed
    isa_check = isa.check(args.isa)
    if args.out is None:
        stem = "linear" if args.isa == "native" else f"linear_{args.isa}"
        args.out = str(Path(__file__).parent / "results" / f"{stem}.json")
    if not packed_linear.onednn_available():
        raise SystemExit("torch built without oneDNN: nothing to compare against")
    threads.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    bandwidth = read_bandwidth()
    print(f"cpu={machine_info()['cpu']!r} threads={torch.get_num_threads()} "
          f"runtime={_core.parallel_runtime()} read bandwidth {bandwidth:.1f} GB/s")
    print(f"{'preset':>6} {'dtype':>8} {'proj':>8} {'[out, in]':>13} {'rows':>5} "
          f"{'pagedllm ms':>11} {'oneDNN ms':>10} {'speedup':>7} {'weights GB/s':>13}")
    results = []
    for preset in args.presets.split(","):
        for dname in args.dtypes.split(","):
            dtype = getattr(torch, dname)
            for proj, (n, k) in projection_shapes(preset).items():
                for r in time_shape(n, k, dtype, rows, args.rounds, args.bytes):
                    r.update(preset=preset, dtype=dname, proj=proj,
                             kernel=_core.linear_kernel(dname))
                    results.append(r)
                    print(f"{preset:>6} {dname:>8} {proj:>8} {str([n, k]):>13} {r['rows']:>5} "
                          f"{r['pagedllm_ms']:11.3f} {r['onednn_ms']:10.3f} {r['speedup']:6.2f}x "
                          f"{r['pagedllm_weight_gbs']:6.1f}/{r['onednn_weight_gbs']:5.1f}",
                          flush=True)
    payload = dict(benchmark="linear", machine=machine_info(), isa=isa_check,
                   read_bandwidth_gbs=bandwidth,
                   threads=torch.get_num_threads(), rounds=args.rounds, rows=rows,
                   results=results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
