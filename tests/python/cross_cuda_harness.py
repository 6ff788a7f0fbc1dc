"""Runs paged_cross_attention of a kernel module (pagedllm._core or pagedllm._core.cuda) on random
paged cross K/V and checks it against the float64 reference and, on CUDA, the CPU kernel.

Backend-generic like cuda_harness.py (whose bounds it uses), so test_cuda_cross_attention.py
checks it against the CPU kernels without a GPU. Which CUDA path runs, and so which bound
applies: float32 caches, GQA groups over 64 and calls of one query token per sequence take the
float32 split-K kernel; the rest the tensor-core kernel (query and probabilities rounded to the
operand type, see cuda_harness.py).
"""

from __future__ import annotations

import math

import torch

from cross_kernel_reference import cross_attention_ref
from cuda_harness import (Backend, assert_within, bound, operand_dtype, place_caches,
                          reference_query)
from kernel_reference import UNIT_ROUNDOFF, make_paged_kv
from pagedllm import _core


def cross_operand_dtype(backend: Backend, kv_dtype: str, act: torch.dtype, group: int,
                        num_tokens: int, num_seqs: int):
    """The tensor-core operand dtype the CUDA cross-attention uses, or None (float32 path)."""
    if num_tokens <= num_seqs:
        return None
    return operand_dtype(backend, kv_dtype, act, group)


def run_cross(backend: Backend, gen, lens, ranges_per_seq, heads, kvh, head_dim, block_size,
              kv_dtype, act, k_scale=1.0, v_scale=1.0, pool_layers=0):
    """One cross-attention call; checks every row (empty ranges exactly zero) and, on CUDA,
    agreement with the CPU kernel. Returns the output on the CPU."""
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, k_scale, v_scale,
                       pool_layers=pool_layers)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor([len(r) for r in ranges_per_seq], dtype=torch.int32).cumsum(0)
    total = int(cu[-1])
    ranges = torch.tensor([r for rs in ranges_per_seq for r in rs],
                          dtype=torch.int32).reshape(total, 2)
    q_cpu = torch.randn((total, heads, head_dim), generator=gen).to(act)
    scale = 1.0 / math.sqrt(head_dim)
    dev = backend.device
    kc, vc = place_caches(kv, dev, pool_layers)
    out = torch.full((total, heads, head_dim), float("nan"), dtype=act, device=dev)
    backend.mod.paged_cross_attention(out, q_cpu.to(dev), kc, vc, kv.block_tables.to(dev),
                                      cu.to(dev), kv.context_lens.to(dev), ranges.to(dev), scale,
                                      kv_dtype, k_scale, v_scale)
    backend.sync()
    op = cross_operand_dtype(backend, kv_dtype, act, heads // kvh, total, len(lens))
    q_ref, ref_scale = reference_query(q_cpu, op, scale, kv_dtype, k_scale)
    refs = torch.zeros((total, heads, head_dim), dtype=torch.float64)
    vmax = 0.0
    for s in range(len(lens)):
        a, e = int(cu[s]), int(cu[s + 1])
        if a == e:
            continue
        refs[a:e] = cross_attention_ref(q_ref[a:e], kv.k_full[s], kv.v_full[s], ref_scale,
                                        ranges[a:e])
        if lens[s]:
            vmax = max(vmax, kv.v_full[s].abs().max().item())
    b = bound(refs, act, op, vmax)
    assert_within(out, refs, b, "cross-attention vs float64")
    out_cpu = out.cpu()
    empty = ranges[:, 0] == ranges[:, 1]
    assert bool((out_cpu[empty] == 0).all()), "an empty range must give an exact zero row"
    if backend.is_cuda:
        cpu_out = torch.full_like(q_cpu, float("nan"))
        _core.paged_cross_attention(cpu_out, q_cpu, kv.key_cache, kv.value_cache,
                                    kv.block_tables, cu, kv.context_lens, ranges, scale,
                                    kv_dtype, k_scale, v_scale)
        cpu_bound = bound(cpu_out.to(torch.float64), act, None, 0.0)
        if op is not None:  # the CPU kernel uses the unrounded query
            cpu_bound = cpu_bound + UNIT_ROUNDOFF[str(op).removeprefix("torch.")] * 4 * (
                q_cpu.abs().max().item() * scale * head_dim ** 0.5) * vmax
        assert_within(out, cpu_out.to(torch.float64), b + cpu_bound,
                      "cross-attention vs CPU kernel")
    return out_cpu
