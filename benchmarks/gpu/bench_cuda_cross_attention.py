"""GPU benchmark of the CUDA cross-attention kernel (paged_cross_attention, Mllama); run on a
device machine with a GPU (benchmarks/gpu/run_on_device.sh).

Shapes of Llama 3.2 Vision 11B's cross layers (32 query / 8 KV heads of 128, block 16), one
image = 4 tiles x 1601 patch tokens = 6404 cross tokens per sequence, blocks in random order,
CUDA events, medians after warm-up, two cache sets alternated so repeats do not hit L2
(bench_cuda_attention.py's helpers):
  * decode (one query token per sequence over all its cross tokens: the split-K kernel): K/V
    bytes read per second as a fraction of the device-to-device copy bandwidth;
  * prefill (every prompt token sees the image: the tensor-core kernel): TFLOP/s against
    torch SDPA (non-causal) on the same K/V laid out contiguously.
Prints a table and writes JSON (default benchmarks/results/cuda_cross_attention.json).

Usage: PYTHONPATH=python python3 benchmarks/gpu/bench_cuda_cross_attention.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda_attention import BLOCK, HEAD_DIM, HEADS, KV_HEADS, PagedSet, copy_bandwidth, \
    time_ms  # noqa: E402

from pagedllm import _core  # noqa: E402

TOKENS_PER_IMAGE = 4 * 1601


class CrossSet(PagedSet):
    """PagedSet of whole blocks, with context_lens set to `images` images' cross tokens."""

    def __init__(self, batch: int, images: int, dtype: torch.dtype, kv_cache_dtype: str):
        tokens = images * TOKENS_PER_IMAGE
        super().__init__(batch, (tokens + BLOCK - 1) // BLOCK * BLOCK, dtype, kv_cache_dtype)
        self.tokens = tokens
        self.context_lens.fill_(tokens)
        self.kv_bytes = 2 * batch * tokens * KV_HEADS * HEAD_DIM * self.key_cache.element_size()


def bench_cross(kind: str, batch: int, q_len: int, images: int, dtype: torch.dtype,
                kv_cache_dtype: str, copy_bw: float) -> dict:
    sets = [CrossSet(batch, images, dtype, kv_cache_dtype) for _ in range(2)]
    tokens = sets[0].tokens
    q = torch.randn(batch * q_len, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * q_len
    ranges = torch.tensor([[0, tokens]], dtype=torch.int32, device="cuda").repeat(batch * q_len, 1)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    turn = [0]

    def run():
        s = sets[turn[0] % 2]
        turn[0] += 1
        _core.cuda.paged_cross_attention(out, q, s.key_cache, s.value_cache, s.block_tables, cu,
                                         s.context_lens, ranges, scale, kv_cache_dtype)

    ms = time_ms(run, inner=4)
    row = dict(kind=kind, batch=batch, q_len=q_len, images=images, cross_tokens=tokens,
               dtype=str(dtype).removeprefix("torch."), kv_cache_dtype=kv_cache_dtype, ms=ms,
               kv_bytes_per_s=sets[0].kv_bytes / (ms / 1e3),
               fraction_of_copy_bw=sets[0].kv_bytes / (ms / 1e3) / copy_bw)
    flops = 2 * 2 * batch * q_len * HEADS * HEAD_DIM * tokens  # QK^T + PV
    row["tflops"] = flops / (ms / 1e3) / 1e12
    del sets
    if kind == "prefill" and not kv_cache_dtype.startswith("fp8"):
        qs = q.view(batch, q_len, HEADS, HEAD_DIM).transpose(1, 2).contiguous()
        ks = torch.randn(batch, KV_HEADS, tokens, HEAD_DIM, device="cuda", dtype=dtype)
        vs = torch.randn_like(ks)
        sdpa_ms = time_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True))
        row.update(sdpa_ms=sdpa_ms, sdpa_tflops=flops / (sdpa_ms / 1e3) / 1e12,
                   speedup_vs_sdpa=sdpa_ms / ms)
        del ks, vs
    torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/cuda_cross_attention.json")
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
    rows = [bench_cross("decode", b, 1, 1, torch.bfloat16, "auto", copy_bw) for b in (1, 8, 64)]
    rows.append(bench_cross("decode", 8, 1, 4, torch.bfloat16, "auto", copy_bw))
    rows.append(bench_cross("decode", 64, 1, 1, torch.bfloat16, "fp8", copy_bw))
    for q_len in (128, 1024):
        rows.append(bench_cross("prefill", 1, q_len, 1, torch.bfloat16, "auto", copy_bw))
    _core.cuda.check_errors(0)
    print(f"{'kind':8} {'batch':>5} {'q':>5} {'img':>3} {'kv':>5} {'ms':>8} {'of copy':>8} "
          f"{'TF/s':>7} {'vs SDPA':>8}")
    for r in rows:
        print(f"{r['kind']:8} {r['batch']:5d} {r['q_len']:5d} {r['images']:3d} "
              f"{r['kv_cache_dtype']:>5} {r['ms']:8.3f} {r['fraction_of_copy_bw']:8.2f} "
              f"{r['tflops']:7.1f} {r.get('speedup_vs_sdpa', float('nan')):8.2f}")
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  copy_bytes_per_s=copy_bw, rows=rows, seconds=time.time() - started,
                  shapes=dict(heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                              block_size=BLOCK, tokens_per_image=TOKENS_PER_IMAGE))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
