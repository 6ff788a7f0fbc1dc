"""Benchmark of the CPU cross-attention kernel (paged_cross_attention, Mllama) against memory
bandwidth and torch SDPA.

Shapes: Llama 3.2 Vision 11B's cross-attention layers (32 query / 8 KV heads, head_dim 128),
cross K/V of whole images (4 tiles x 1601 patch tokens each) in randomly permuted blocks of 16,
storage bf16 or fp8 (e4m3).
  * decode: one query token per sequence seeing its whole cross context (a generation step);
    reported as cross K/V bytes read per second and that as a fraction of the read bandwidth
    measured in the same rounds (a 1 GiB float32 sum on all kernel threads, which also evicts
    the caches), like bench_attention.py's decode; the target is 0.8 (fp8 0.6).
  * prefill: a prompt of P tokens all seeing the image (the prompt's prefill step);
    tokens per second, and SDPA (non-causal, the same K/V laid out contiguously; fp8 -> bf16)
    time / kernel time.
Each figure is the best of interleaved rounds (the machine is shared); medians are in the JSON.

Usage: PYTHONPATH=python python benchmarks/bench_cross_attention.py [--quick] [--rounds N]
Writes benchmarks/results/cross_attention.json (--out to change).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.bench_attention import Bandwidth, cpu_model, timed
from pagedllm import _core

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
TOKENS_PER_IMAGE = 4 * 1601  # 4 tiles of (560 / 14)^2 + 1 patches
STORAGE = {"bf16": (torch.bfloat16, "auto"), "fp8": (torch.uint8, "fp8")}
TARGET_FRAC = {"bf16": 0.8, "fp8": 0.6}


def make_case(num_seqs: int, q_len: int, images: int, storage: str, gen: torch.Generator):
    """Cross caches of `images` images per sequence, q_len query tokens per sequence each
    seeing all of them, and the contiguous copy SDPA reads."""
    dtype, kv_cache_dtype = STORAGE[storage]
    ctx = images * TOKENS_PER_IMAGE
    per_seq = (ctx + BLOCK - 1) // BLOCK
    blocks = num_seqs * per_seq
    shape = (blocks, KV_HEADS, BLOCK, HEAD_DIM)
    kc, vc = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    if dtype == torch.uint8:
        kc = kc.to(torch.float8_e4m3fn).view(torch.uint8)
        vc = vc.to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        kc, vc = kc.to(dtype), vc.to(dtype)
    tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(num_seqs, per_seq)
    lens = torch.full((num_seqs,), ctx, dtype=torch.int32)
    cu = torch.arange(num_seqs + 1, dtype=torch.int32) * q_len
    ranges = torch.tensor([[0, ctx]], dtype=torch.int32).repeat(num_seqs * q_len, 1)
    act = torch.bfloat16
    q = torch.randn((num_seqs * q_len, HEADS, HEAD_DIM), generator=gen).to(act)

    def contiguous(cache):  # [S, KVH, ctx, D] bf16
        c = cache[tables.long()]  # [S, blocks, KVH, bs, D]
        if dtype == torch.uint8:
            c = c.view(torch.float8_e4m3fn).to(torch.bfloat16)
        c = c.permute(0, 2, 1, 3, 4).reshape(num_seqs, KV_HEADS, per_seq * BLOCK, HEAD_DIM)
        return c[:, :, :ctx].contiguous()

    q_sdpa = q.reshape(num_seqs, q_len, HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    return dict(kc=kc, vc=vc, tables=tables, lens=lens, cu=cu, ranges=ranges, q=q,
                out=torch.empty_like(q), kv_cache_dtype=kv_cache_dtype, q_sdpa=q_sdpa,
                k_sdpa=contiguous(kc), v_sdpa=contiguous(vc),
                kv_bytes=2 * num_seqs * ctx * KV_HEADS * HEAD_DIM * kc.element_size())


def bench_case(kind: str, num_seqs: int, q_len: int, images: int, storage: str,
               bw: Bandwidth, rounds: int, gen) -> dict:
    c = make_case(num_seqs, q_len, images, storage, gen)
    scale = 1.0 / math.sqrt(HEAD_DIM)

    def kernel():
        _core.paged_cross_attention(c["out"], c["q"], c["kc"], c["vc"], c["tables"], c["cu"],
                                    c["lens"], c["ranges"], scale, c["kv_cache_dtype"])

    def sdpa():
        F.scaled_dot_product_attention(c["q_sdpa"], c["k_sdpa"], c["v_sdpa"], scale=scale,
                                       enable_gqa=True)

    kernel(), sdpa()
    ts, ts_sdpa, bws = [], [], []
    for _ in range(rounds):  # interleaved: a probe (evicting the caches) before each timing
        bws.append(bw.measure())
        ts.append(timed(kernel))
        bw.measure()
        ts_sdpa.append(timed(sdpa))
    t, t_sdpa, bandwidth = min(ts), min(ts_sdpa), max(bws)
    tokens = num_seqs * q_len
    return dict(kind=kind, num_seqs=num_seqs, q_len=q_len, images=images, storage=storage,
                cross_tokens=images * TOKENS_PER_IMAGE, kernel_ms=t * 1e3,
                kernel_ms_median=statistics.median(ts) * 1e3, sdpa_ms=t_sdpa * 1e3,
                speedup_vs_sdpa=t_sdpa / t, tokens_per_s=tokens / t,
                kv_gbps=c["kv_bytes"] / t / 1e9, read_bw_gbps=bandwidth / 1e9,
                frac_of_bw=c["kv_bytes"] / t / bandwidth, target_frac=TARGET_FRAC[storage])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few small cases (smoke run)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                         "cross_attention.json"))
    args = ap.parse_args()
    torch.set_num_threads(_core.get_num_threads())  # SDPA gets the same cores as the kernels
    gen = torch.Generator().manual_seed(0)
    bw = Bandwidth(0.25 if args.quick else 1.0)
    if args.quick:
        cases = [("decode", 2, 1, 1), ("prefill", 1, 64, 1)]
        rounds = min(args.rounds, 2)
    else:
        cases = [("decode", 1, 1, 1), ("decode", 8, 1, 1), ("decode", 4, 1, 2),
                 ("prefill", 1, 128, 1), ("prefill", 1, 512, 1)]
        rounds = args.rounds
    print(f"cpu={cpu_model()!r} threads={_core.get_num_threads()} kernel={_core.cpu_kernel()}")
    print(f"{'kind':>7} {'seqs':>4} {'q':>4} {'img':>3} {'kv':>4} {'ms':>8} {'GB/s':>6} "
          f"{'of bw':>6} {'tok/s':>9} {'vs sdpa':>7}")
    rows = []
    for kind, seqs, q_len, images in cases:
        for storage in STORAGE:
            r = bench_case(kind, seqs, q_len, images, storage, bw, rounds, gen)
            rows.append(r)
            print(f"{kind:>7} {seqs:>4} {q_len:>4} {images:>3} {storage:>4} "
                  f"{r['kernel_ms']:8.2f} {r['kv_gbps']:6.1f} {r['frac_of_bw']:6.2f} "
                  f"{r['tokens_per_s']:9.0f} {r['speedup_vs_sdpa']:7.2f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(
        cpu=cpu_model(), threads=_core.get_num_threads(), engine=_core.cpu_kernel(),
        heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK,
        tokens_per_image=TOKENS_PER_IMAGE, rounds=rounds, cases=rows), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
