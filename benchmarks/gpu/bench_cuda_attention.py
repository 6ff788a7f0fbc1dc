"""GPU benchmark of the CUDA paged-attention kernels (run on a device machine with a GPU).

Measured in one process on one GPU, all with CUDA events, medians of repeated timed runs after
warm-up, rotating between two cache sets so that repeats are not served from L2:
  * device-to-device copy bandwidth: a torch copy of a large buffer, (bytes read + written) / s;
  * decode: K/V bytes read per second by paged_attention_decode (Llama-3-8B-like shapes: 32 query
    heads, 8 KV heads, head_dim 128, block_size 16), as a fraction of the copy bandwidth (goal
    >= 0.85), and torch's scaled_dot_product_attention on the same data laid out contiguously;
  * prefill: TFLOP/s of paged_attention_prefill against SDPA (causal) on contiguous data.
Prints a table and writes JSON (default benchmarks/results/cuda_attention.json).

Usage: PYTHONPATH=python python3 benchmarks/gpu/bench_cuda_attention.py [--out PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from pagedllm import _core

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def time_ms(fn, warmup: int = 3, repeats: int = 15, inner: int = 1) -> float:
    """Median milliseconds of one call of fn (inner calls per timed run)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def copy_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    n = int(gib * (1 << 30)) // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup=3, repeats=20)
    del src, dst
    return 2 * n * 4 / (ms / 1e3)


class PagedSet:
    """Random paged K/V for `batch` sequences of `ctx` tokens, blocks in random order."""

    def __init__(self, batch: int, ctx: int, dtype: torch.dtype, kv_cache_dtype: str):
        blocks_per_seq = ctx // BLOCK
        num_blocks = batch * blocks_per_seq
        store = torch.uint8 if kv_cache_dtype.startswith("fp8") else dtype
        shape = (num_blocks, KV_HEADS, BLOCK, HEAD_DIM)
        if store == torch.uint8:
            f8 = torch.float8_e4m3fn if kv_cache_dtype in ("fp8", "fp8_e4m3") else torch.float8_e5m2
            self.key_cache = torch.randn(shape, device="cuda").to(f8).view(torch.uint8)
            self.value_cache = torch.randn(shape, device="cuda").to(f8).view(torch.uint8)
        else:
            self.key_cache = torch.randn(shape, device="cuda", dtype=dtype)
            self.value_cache = torch.randn(shape, device="cuda", dtype=dtype)
        perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
        self.block_tables = perm.view(batch, blocks_per_seq).contiguous()
        self.context_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        self.kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * self.key_cache.element_size()


def bench_decode(batch: int, ctx: int, dtype: torch.dtype, kv_cache_dtype: str,
                 copy_bw: float) -> dict:
    sets = [PagedSet(batch, ctx, dtype, kv_cache_dtype) for _ in range(2)]
    q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    turn = [0]

    def run():
        s = sets[turn[0] % 2]
        turn[0] += 1
        _core.cuda.paged_attention_decode(out, q, s.key_cache, s.value_cache, s.block_tables,
                                          s.context_lens, scale, kv_cache_dtype)

    ms = time_ms(run, inner=4)
    bw = sets[0].kv_bytes / (ms / 1e3)
    row = dict(kernel="decode", batch=batch, context=ctx, dtype=str(dtype).removeprefix("torch."),
               kv_cache_dtype=kv_cache_dtype, ms=ms, kv_bytes=sets[0].kv_bytes,
               kv_bytes_per_s=bw, fraction_of_copy_bw=bw / copy_bw)
    del sets
    if not kv_cache_dtype.startswith("fp8"):  # SDPA on contiguous K/V of the same size
        qs = q.view(batch, HEADS, 1, HEAD_DIM)
        ks = [torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device="cuda", dtype=dtype)
              for _ in range(2)]
        vs = [torch.randn_like(k) for k in ks]
        turn[0] = 0

        def sdpa():
            i = turn[0] % 2
            turn[0] += 1
            F.scaled_dot_product_attention(qs, ks[i], vs[i], enable_gqa=True)

        sdpa_ms = time_ms(sdpa, inner=4)
        row.update(sdpa_ms=sdpa_ms, sdpa_kv_bytes_per_s=row["kv_bytes"] / (sdpa_ms / 1e3),
                   speedup_vs_sdpa=sdpa_ms / ms)
        del ks, vs
    torch.cuda.empty_cache()
    return row


def bench_prefill(batch: int, prompt: int, dtype: torch.dtype) -> dict:
    s = PagedSet(batch, prompt, dtype, "auto")
    q = torch.randn(batch * prompt, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    cu = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * prompt
    scale = 1.0 / math.sqrt(HEAD_DIM)
    ms = time_ms(lambda: _core.cuda.paged_attention_prefill(
        out, q, s.key_cache, s.value_cache, s.block_tables, cu, s.context_lens, scale))
    flops = 2 * 2 * batch * HEADS * HEAD_DIM * prompt * (prompt + 1) / 2  # causal QK^T + PV
    qs = q.view(batch, prompt, HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    ks = torch.randn(batch, KV_HEADS, prompt, HEAD_DIM, device="cuda", dtype=dtype)
    vs = torch.randn_like(ks)
    sdpa_ms = time_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True,
                                                             enable_gqa=True))
    return dict(kernel="prefill", batch=batch, prompt=prompt,
                dtype=str(dtype).removeprefix("torch."), ms=ms, tflops=flops / (ms / 1e3) / 1e12,
                sdpa_ms=sdpa_ms, sdpa_tflops=flops / (sdpa_ms / 1e3) / 1e12,
                speedup_vs_sdpa=sdpa_ms / ms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/cuda_attention.json")
    ap.add_argument("--quick", action="store_true", help="fewer configurations")
    args = ap.parse_args()
    if not torch.cuda.is_available() or getattr(_core, "cuda", None) is None \
            or _core.cuda.device_count() == 0:
        print("needs a CUDA GPU and a pagedllm build with CUDA", file=sys.stderr)
        return 2
    _core.cuda.set_validation("deferred")  # no host sync per call while timing
    started = time.time()
    copy_bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth (read+write): "
          f"{copy_bw / 1e12:.2f} TB/s", flush=True)
    decode_cfgs = [(1, 32768), (8, 8192), (32, 4096), (64, 2048), (128, 2048), (256, 1024)]
    if args.quick:
        decode_cfgs = [(1, 32768), (64, 2048), (256, 1024)]
    rows = []
    for batch, ctx in decode_cfgs:
        rows.append(bench_decode(batch, ctx, torch.bfloat16, "auto", copy_bw))
    rows.append(bench_decode(64, 2048, torch.bfloat16, "fp8", copy_bw))
    rows.append(bench_decode(64, 2048, torch.float16, "auto", copy_bw))
    for batch, prompt in ([(1, 4096), (4, 2048), (16, 512)] if not args.quick else [(4, 2048)]):
        rows.append(bench_prefill(batch, prompt, torch.bfloat16))
    _core.cuda.check_errors(0)

    print(f"{'kernel':8} {'batch':>5} {'len':>6} {'kv':>6} {'ms':>8} {'GB/s|TF/s':>10} "
          f"{'of copy':>8} {'vs SDPA':>8}")
    for r in rows:
        if r["kernel"] == "decode":
            print(f"decode   {r['batch']:5d} {r['context']:6d} {r['kv_cache_dtype']:>6} "
                  f"{r['ms']:8.3f} {r['kv_bytes_per_s'] / 1e9:10.0f} "
                  f"{r['fraction_of_copy_bw']:8.2f} {r.get('speedup_vs_sdpa', float('nan')):8.2f}")
        else:
            print(f"prefill  {r['batch']:5d} {r['prompt']:6d} {'auto':>6} {r['ms']:8.3f} "
                  f"{r['tflops']:10.1f} {'':>8} {r['speedup_vs_sdpa']:8.2f}")
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  build=_core.build_info(), copy_bytes_per_s=copy_bw, rows=rows,
                  shapes=dict(heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK),
                  seconds=time.time() - started)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
