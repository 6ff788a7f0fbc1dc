"""vLLM's CPU decode-attention kernel as a timed peer, run in vLLM's own venv.

bench_attention.py starts this script with the vLLM venv's python (worker_client.WorkerPeer,
the protocol of worker_protocol.py) so that vLLM's kernel is timed in the same rounds as
pagedllm's, each timing after the parent's bandwidth probe (which also evicts the caches):
  {"op": "case", "key": K, "batch": B, "context": L, "storage": "fp32"|"bf16"|"fp8",
   "block_size": bs, "heads": H, "kv_heads": KVH, "head_dim": D, "threads": T}
      -> {"isa": ..., "kv_bytes": ...}    (builds case K's cache and metadata, runs it once)
  {"op": "time", "key": K} -> {"s": seconds of one kernel call}
  {"op": "drop"}                          (frees every case)
The data: K/V in vLLM's CPU layout ([blocks, KVH, 2 * bs, D], K then V per block), blocks in
a random permutation, every sequence `context` tokens long, one query token each; the same
shapes, dtypes and bytes as pagedllm's case (fp8: e4m3 bytes, k_scale = v_scale = 1).
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch

from worker_protocol import reply, serve  # beside this script (run as a file)
from vllm_isa import hold_to_emulated_isa, kernel_libraries

hold_to_emulated_isa()  # PAGEDLLM_BENCH_ISA=avx2: vLLM's AVX2 kernels (benchmarks/isa.py)


def _ops():
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # loads the AVX-512 / AVX2 build this CPU runs
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    return ops, _get_attn_isa


class Case:
    """One decode case in vLLM's layout with its scheduler metadata."""

    def __init__(self, ops, get_isa, a: dict):
        torch.set_num_threads(a["threads"])
        b, ctx, bs = a["batch"], a["context"], a["block_size"]
        h, kvh, d = a["heads"], a["kv_heads"], a["head_dim"]
        storage = a["storage"]
        act = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.bfloat16}[storage]
        self.kv_dtype = "fp8" if storage == "fp8" else "auto"
        gen = torch.Generator().manual_seed(1)
        blocks = b * ctx // bs
        cache = torch.randn((blocks, kvh, 2 * bs, d), generator=gen)
        if storage == "fp8":
            cache = cache.to(torch.float8_e4m3fn).view(torch.uint8)
        else:
            cache = cache.to(act)
        self.k, self.v = cache.chunk(2, dim=2)  # [blocks, KVH, bs, D] views
        self.tables = torch.randperm(blocks, generator=gen).to(torch.int32).reshape(b, ctx // bs)
        self.lens = torch.full((b,), ctx, dtype=torch.int32)
        self.qsl = torch.arange(b + 1, dtype=torch.int32)
        self.q = torch.randn((b, h, d), generator=gen).to(act)
        self.out = torch.empty_like(self.q)
        self.scale = 1.0 / math.sqrt(d)
        self.isa = get_isa(act, bs, d, self.kv_dtype)
        self.meta = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=b, num_heads=h, num_kv_heads=kvh, head_dim=d, seq_lens=self.lens,
            dtype=act, query_start_loc=self.qsl, causal=True, sliding_window_size=-1,
            isa=self.isa, enable_kv_split=False, kv_cache_dtype=self.kv_dtype)
        self.ops = ops
        self.kv_bytes = 2 * b * ctx * kvh * d * cache.element_size()

    def run(self) -> None:
        self.ops.cpu_attention_with_kv_cache(
            query=self.q, key_cache=self.k, value_cache=self.v, output=self.out,
            query_start_loc=self.qsl, seq_lens=self.lens, scale=self.scale, causal=True,
            alibi_slopes=None, sliding_window=-1, block_table=self.tables, softcap=0.0,
            scheduler_metadata=self.meta, s_aux=None, kv_cache_dtype=self.kv_dtype)


def main() -> None:
    t0 = time.perf_counter()
    ops, get_isa = _ops()
    state: dict = {}

    def case(cmd: dict) -> dict:
        state.pop(cmd["key"], None)  # frees a previous case of that key first
        c = state[cmd["key"]] = Case(ops, get_isa, cmd)
        c.run()  # warm-up
        return {"isa": c.isa, "kv_bytes": c.kv_bytes}

    def timed(cmd: dict) -> dict:
        c = state[cmd["key"]]
        t = time.perf_counter()
        c.run()
        return {"s": time.perf_counter() - t}

    reply({"event": "ready", "startup_s": time.perf_counter() - t0,
           "version": __import__("vllm").__version__, "kernel_libraries": kernel_libraries(os.getpid())})
    serve({"case": case, "time": timed, "drop": lambda cmd: state.clear()})


if __name__ == "__main__":
    sys.exit(main())
