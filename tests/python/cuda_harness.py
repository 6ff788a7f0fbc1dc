"""Runs a paged-attention kernel module (pagedllm._core or pagedllm._core.cuda) on random paged
K/V and checks it against the float64 reference and, for the CUDA kernels, the CPU kernels.

The harness is backend-generic so that it can be checked without a GPU: test_cuda_kernels.py
runs it once against the CPU kernels on CPU tensors (harness self-check) and, on a GPU, against
the CUDA kernels. Error bounds per element, with u_x the unit roundoff of type x:
  * float32 arithmetic paths (decode, split-K, SIMT prefill):
      |out - ref| <= u_out |ref| + 2e-5 max(1, max|ref|)
  * tensor-core prefill (operands in fp16, or bf16 for bf16 caches): the reference uses the
    query exactly as the kernel rounds it (q * scale [* k_scale], rounded to the operand type),
    and the probabilities' rounding to the operand type adds at most u_op max|v|:
      |out - ref| <= u_out |ref| + 2 u_op max|v| + 2e-5 max(1, max|ref|)
  * the CPU kernels for a bf16 model on bf16 / fp8 caches with AVX512_BF16 (cpu_prob_dtype):
    exact scores, probabilities rounded to bf16: the same bound with u_op = u_bf16
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from kernel_reference import UNIT_ROUNDOFF, attention_ref, make_paged_kv, storage_torch_dtype
from pagedllm import _core

ABS_TOL = 2e-5


@dataclass
class Backend:
    """A kernel module and the device its tensors live on."""
    mod: object
    device: str

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize()


CPU = Backend(_core, "cpu")


def place_caches(kv, device: str, pool_layers: int):
    """The caches of `kv` on `device`, keeping pool views as views of a moved pool."""
    if device == "cpu":
        return kv.key_cache, kv.value_cache
    if pool_layers > 0:
        pool = kv.key_cache._base.to(device)
        return pool[:, pool_layers - 1, 0], pool[:, pool_layers - 1, 1]
    return kv.key_cache.to(device), kv.value_cache.to(device)


def operand_dtype(backend: Backend, kv_dtype: str, act: torch.dtype, group: int):
    """The tensor-core operand dtype the CUDA prefill uses, or None for a float32 path."""
    if not backend.is_cuda:
        return None
    storage = storage_torch_dtype(kv_dtype, act)
    if storage == torch.float32 or group > 64:
        return None
    return torch.bfloat16 if storage == torch.bfloat16 else torch.float16


def cpu_prob_dtype(kv_dtype: str, act: torch.dtype, head_dim: int, decode: bool = False):
    """The dtype the CPU kernels round their probabilities to for p.v, or None (exact).

    bf16 for a bf16 query (a bf16 model's) on a bf16 or fp8 cache under "auto" on the avx512
    engine of a CPU with AVX512_BF16: prefill (engine_prefill_impl.h) when head_dim is a
    multiple of 16; decode (the avx512_bf16 engine, which needs AVX512_VBMI too) when it is a
    multiple of 32. "auto" and the avx512 engine named are not told apart here: the bound only
    widens. The scores stay exact (the query is bf16 already), so the reference query does not
    change; the bound gains 2 u_bf16 max|v|.
    """
    storage = storage_torch_dtype(kv_dtype, act)
    if decode:
        has = "avx512_bf16" in _core.cpu_engines() and head_dim % 32 == 0
    else:
        has = "avx512bf16" in _core.build_info()["cpu_features"] and head_dim % 16 == 0
    rounds = (act == torch.bfloat16 and storage in (torch.bfloat16, torch.uint8) and has
              and _core.get_cpu_engine() == "avx512")
    return torch.bfloat16 if rounds else None


def bound(ref: torch.Tensor, out_dtype: torch.dtype, op_dtype, vmax: float) -> torch.Tensor:
    u = UNIT_ROUNDOFF[str(out_dtype).removeprefix("torch.")]
    peak = ref.abs().max().item() if ref.numel() else 0.0
    b = u * ref.abs() + ABS_TOL * max(1.0, peak)
    if op_dtype is not None:
        b = b + 2 * UNIT_ROUNDOFF[str(op_dtype).removeprefix("torch.")] * vmax
    return b


def assert_within(out: torch.Tensor, ref: torch.Tensor, b: torch.Tensor, what: str) -> None:
    out64 = out.detach().cpu().to(torch.float64)
    assert not torch.isnan(out64).any(), f"{what}: output has NaN (unwritten or poisoned data read)"
    if out64.numel() == 0:
        return
    err = (out64 - ref).abs()
    worst = (err - b).max().item()
    assert worst <= 0, f"{what}: max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"


def kernel_qmul(scale: float, kv_dtype: str, k_scale: float) -> np.float32:
    """The float32 query multiplier the kernels compute."""
    ks = np.float32(k_scale) if kv_dtype.startswith("fp8") else np.float32(1.0)
    return np.float32(np.float32(scale) * ks)


def reference_query(q_cpu: torch.Tensor, op, scale: float, kv_dtype: str, k_scale: float):
    """The query and softmax scale the float64 reference takes for a kernel call.

    Args:
        q_cpu: the query the kernel was given, [tokens, heads, head_dim].
        op: the tensor cores' operand dtype (operand_dtype / cross_operand_dtype), or None when
            the call runs on CUDA cores.
        scale, kv_dtype, k_scale: the kernel call's.

    Returns:
        (q_ref, ref_scale): with tensor cores, the query exactly as they see it (scale and the
        fp8 key scale folded in, rounded to op, the key scale divided back out) and 1.0; else
        q_cpu and scale.
    """
    if op is None:
        return q_cpu, scale
    qmul = kernel_qmul(scale, kv_dtype, k_scale)
    ks = k_scale if kv_dtype.startswith("fp8") else 1.0
    return (q_cpu.float() * torch.tensor(qmul)).to(op).to(torch.float64) / ks, 1.0

def run_decode(backend: Backend, gen, lens, heads, kvh, head_dim, block_size, kv_dtype, act,
               k_scale=1.0, v_scale=1.0, pool_layers=0, strided_query=False):
    """One decode call on random data; checks every sequence (and the CPU kernel, on CUDA)."""
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, k_scale, v_scale,
                       pool_layers=pool_layers)
    n = len(lens)
    if strided_query:  # a slice of a fused qkv projection: token stride > heads * head_dim
        qkv = torch.randn((n, heads + 2 * kvh, head_dim), generator=gen).to(act)
        q_cpu, q = qkv[:, :heads], qkv.to(backend.device)[:, :heads]
    else:
        q_cpu = torch.randn((n, heads, head_dim), generator=gen).to(act)
        q = q_cpu.to(backend.device)
    scale = 1.0 / math.sqrt(head_dim)
    kc, vc = place_caches(kv, backend.device, pool_layers)
    out = torch.full((n, heads, head_dim), float("nan"), dtype=act, device=backend.device)
    backend.mod.paged_attention_decode(out, q, kc, vc, kv.block_tables.to(backend.device),
                                       kv.context_lens.to(backend.device), scale, kv_dtype,
                                       k_scale, v_scale)
    backend.sync()
    refs = torch.zeros((n, heads, head_dim), dtype=torch.float64)
    for s, length in enumerate(lens):
        refs[s:s + 1] = attention_ref(q_cpu[s:s + 1], kv.k_full[s], kv.v_full[s], scale,
                                      torch.tensor([length - 1]))
    cpu_probs = cpu_prob_dtype(kv_dtype, act, head_dim, decode=True)
    vmax = max(kv.v_full[s].abs().max().item() for s in range(n)) if cpu_probs else 0.0
    b = bound(refs, act, None if backend.is_cuda else cpu_probs, vmax)
    assert_within(out, refs, b, "decode vs float64")
    if backend.is_cuda:  # and against the CPU kernel, within both kernels' bounds
        cpu_out = torch.full_like(q_cpu, float("nan"))
        _core.paged_attention_decode(cpu_out, q_cpu, kv.key_cache, kv.value_cache,
                                     kv.block_tables, kv.context_lens, scale, kv_dtype, k_scale,
                                     v_scale)
        assert_within(out, cpu_out.to(torch.float64), b + bound(refs, act, cpu_probs, vmax),
                      "decode vs CPU kernel")


def run_prefill(backend: Backend, gen, lens, q_lens, heads, kvh, head_dim, block_size, kv_dtype,
                act, k_scale=1.0, v_scale=1.0, pool_layers=0):
    """One prefill call (cached prefixes where q_len < len); checks every sequence."""
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, k_scale, v_scale,
                       pool_layers=pool_layers)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    total = int(cu[-1])
    q_cpu = torch.randn((total, heads, head_dim), generator=gen).to(act)
    scale = 1.0 / math.sqrt(head_dim)
    kc, vc = place_caches(kv, backend.device, pool_layers)
    out = torch.full((total, heads, head_dim), float("nan"), dtype=act, device=backend.device)
    backend.mod.paged_attention_prefill(out, q_cpu.to(backend.device), kc, vc,
                                        kv.block_tables.to(backend.device), cu.to(backend.device),
                                        kv.context_lens.to(backend.device), scale, kv_dtype,
                                        k_scale, v_scale)
    backend.sync()
    op = operand_dtype(backend, kv_dtype, act, heads // kvh)
    q_ref, ref_scale = reference_query(q_cpu, op, scale, kv_dtype, k_scale)
    refs = torch.zeros((total, heads, head_dim), dtype=torch.float64)
    vmax = 0.0
    for s, (length, q_len) in enumerate(zip(lens, q_lens)):
        a, e = int(cu[s]), int(cu[s + 1])
        if a == e:
            continue
        pos = torch.arange(length - q_len, length)
        refs[a:e] = attention_ref(q_ref[a:e], kv.k_full[s], kv.v_full[s], ref_scale, pos)
        vmax = max(vmax, kv.v_full[s].abs().max().item())
    cpu_probs = cpu_prob_dtype(kv_dtype, act, head_dim)
    b = bound(refs, act, op if backend.is_cuda else cpu_probs, vmax)
    assert_within(out, refs, b, "prefill vs float64")
    if backend.is_cuda:
        cpu_out = torch.full_like(q_cpu, float("nan"))
        _core.paged_attention_prefill(cpu_out, q_cpu, kv.key_cache, kv.value_cache,
                                      kv.block_tables, cu, kv.context_lens, scale, kv_dtype,
                                      k_scale, v_scale)
        cpu_bound = bound(cpu_out.to(torch.float64), act, cpu_probs, vmax)
        if op is not None:  # the CPU kernel uses the unrounded query
            cpu_bound = cpu_bound + UNIT_ROUNDOFF[str(op).removeprefix("torch.")] * 4 * (
                q_cpu.abs().max().item() * scale * head_dim ** 0.5) * vmax
        assert_within(out, cpu_out.to(torch.float64), b + cpu_bound, "prefill vs CPU kernel")
