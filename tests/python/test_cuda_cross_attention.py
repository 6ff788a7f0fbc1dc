"""paged_cross_attention on the GPU (pagedllm._core.cuda) against the float64 reference and the
CPU kernel: both CUDA paths (tensor cores for fp16/bf16/fp8 caches; the float32 split-K kernel
for float32 caches, GQA groups over 64, and decode calls), every compiled head dim, storage and
activation dtypes, block sizes, empty / partial / full ranges in one tile, mixed decode and
prefill packing, long cross contexts (split-K), and bad ranges (recorded on the device, raised
naming kv_ranges[i], the context still usable). GPU tests are marked `gpu` (skipped cleanly
without one, see conftest.py); `test_harness_self_check` runs the harness on the CPU kernel so
that it is exercised everywhere.
"""

from __future__ import annotations

import random

import pytest
import torch

from cross_cuda_harness import run_cross
from cross_kernel_reference import random_ranges
from cuda_fixtures import CUDA, cuda_backend, stop_if_the_context_breaks  # noqa: F401 (fixtures)
from cuda_harness import CPU
from pagedllm import ops

gpu = pytest.mark.gpu

HEAD_DIMS = [64, 80, 96, 128, 256]
KV_DTYPES = ["auto", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
ACT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ACT_IDS = ["f32", "bf16", "f16"]


def mixed_ranges(rng: random.Random, lens: list[int], q_lens: list[int]):
    return [random_ranges(rng, ql, n) for ql, n in zip(q_lens, lens)]


def test_harness_self_check():
    """The GPU tests' harness accepts the CPU kernel (so it tests the kernels, not itself)."""
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    lens = [300, 0, 77]
    run_cross(CPU, gen, lens, mixed_ranges(rng, lens, [40, 2, 1]), 16, 4, 64, 16, "bf16",
              torch.bfloat16, pool_layers=2)


@pytest.mark.skipif(CUDA is None, reason="built without nvcc")
def test_cuda_module_refuses_cpu_tensors():
    """Where CUDA is compiled in (GPU or not): CPU tensors get a clear ValueError, no crash."""
    a = dict(out=torch.zeros((2, 4, 64)), query=torch.randn((2, 4, 64)),
             key_cache=torch.randn((4, 2, 16, 64)), value_cache=torch.randn((4, 2, 16, 64)),
             block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
             cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32),
             context_lens=torch.tensor([20, 7], dtype=torch.int32),
             kv_ranges=torch.tensor([[0, 20], [0, 7]], dtype=torch.int32), scale=0.125)
    with pytest.raises(ValueError, match=r"is on cpu; pagedllm\._core\.cuda takes CUDA tensors"):
        CUDA.paged_cross_attention(**a)


@gpu
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("act", ACT_DTYPES, ids=ACT_IDS)
def test_cross_every_head_dim_and_dtype(cuda_backend, head_dim, kv_dtype, act):
    rng = random.Random(head_dim)
    gen = torch.Generator().manual_seed(head_dim)
    lens = [257, 64, 5]
    fp8 = kv_dtype.startswith("fp8")
    run_cross(cuda_backend, gen, lens, mixed_ranges(rng, lens, [70, 9, 1]), 16, 4, head_dim,
              16, kv_dtype, act, k_scale=0.5 if fp8 else 1.0, v_scale=2.0 if fp8 else 1.0)


@gpu
@pytest.mark.parametrize("heads,kvh", [(8, 8), (8, 2), (32, 4), (8, 1), (64, 1), (72, 1)])
@pytest.mark.parametrize("block_size", [1, 8, 16, 256])
def test_cross_gqa_and_block_sizes(cuda_backend, heads, kvh, block_size):
    rng = random.Random(heads * 7 + block_size)
    gen = torch.Generator().manual_seed(heads + block_size)
    lens = [400, 33]
    run_cross(cuda_backend, gen, lens, mixed_ranges(rng, lens, [50, 3]), heads, kvh, 128,
              block_size, "bf16", torch.bfloat16, pool_layers=2)


@gpu
@pytest.mark.parametrize("kv_dtype", ["auto", "bf16"])
def test_cross_ranges_in_one_tile(cuda_backend, kv_dtype):
    """Rows of one tile with every kind of range, starting and ending inside key tiles."""
    gen = torch.Generator().manual_seed(3)
    n = 600
    ranges = [(0, 0), (0, n), (0, 1), (n - 1, n), (129, 130), (5, 517), (128, 256), (n, n),
              (300, 300), (1, n)]
    run_cross(cuda_backend, gen, [n], [ranges], 8, 2, 128, 16, kv_dtype, torch.bfloat16)


@gpu
@pytest.mark.parametrize("kv_dtype", ["auto", "bf16", "fp8_e4m3"])
def test_cross_decode_and_long_contexts(cuda_backend, kv_dtype):
    """One query token per sequence (the split-K path), cross contexts of several images."""
    gen = torch.Generator().manual_seed(4)
    lens = [4 * 1601, 1601, 2 * 1601, 0]
    ranges = [[(0, 4 * 1601)], [(0, 1601)], [(1601, 2 * 1601)], [(0, 0)]]
    run_cross(cuda_backend, gen, lens, ranges, 32, 8, 128, 16, kv_dtype, torch.bfloat16)


@gpu
@pytest.mark.parametrize("seed", range(6))
def test_cross_random_mixed_packing(cuda_backend, seed):
    rng = random.Random(500 + seed)
    gen = torch.Generator().manual_seed(seed)
    heads, kvh = rng.choice([(8, 8), (16, 2), (32, 8), (8, 1)])
    lens = [rng.choice([0, 1, 16, rng.randint(1, 2000)]) for _ in range(rng.randint(1, 5))]
    q_lens = [rng.choice([0, 1, 1, rng.randint(2, 150)]) for _ in lens]
    run_cross(cuda_backend, gen, lens, mixed_ranges(rng, lens, q_lens), heads, kvh,
              rng.choice(HEAD_DIMS), rng.choice([1, 16, 32]), rng.choice(KV_DTYPES),
              rng.choice(ACT_DTYPES))


def small_cross_args(kv_dtype: str = "bf16"):
    gen = torch.Generator().manual_seed(9)
    kc = torch.randn((6, 2, 16, 64), generator=gen).to(torch.bfloat16).cuda()
    vc = torch.randn((6, 2, 16, 64), generator=gen).to(torch.bfloat16).cuda()
    if kv_dtype == "auto":
        kc, vc = kc.float(), vc.float()
    return dict(out=torch.zeros((5, 8, 64), dtype=torch.bfloat16, device="cuda"),
                query=torch.randn((5, 8, 64), generator=gen).to(torch.bfloat16).cuda(),
                key_cache=kc, value_cache=vc,
                block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda"),
                cu_seqlens_q=torch.tensor([0, 4, 5], dtype=torch.int32, device="cuda"),
                context_lens=torch.tensor([20, 32], dtype=torch.int32, device="cuda"),
                kv_ranges=torch.tensor([[0, 20], [0, 0], [3, 9], [0, 20], [0, 32]],
                                       dtype=torch.int32, device="cuda"),
                scale=0.125)


@gpu
@pytest.mark.parametrize("kv_dtype", ["bf16", "auto"])  # tensor cores; float32 split-K
@pytest.mark.parametrize("bad,exc,msg", [
    ([0, 21], IndexError, r"kv_ranges\[0\] = \(0, 21\) is outside \[0, 20\]"),
    ([-1, 3], IndexError, r"kv_ranges\[0\] = \(-1, 3\) is outside"),
    ([9, 3], ValueError, r"kv_ranges\[0\] = \(9, 3\): lo must be <= hi"),
], ids=["past_end", "negative", "lo_above_hi"])
def test_cross_bad_range_raises_and_the_context_survives(kv_dtype, bad, exc, msg):
    a = small_cross_args(kv_dtype)
    a["kv_ranges"][0] = torch.tensor(bad, dtype=torch.int32)
    with pytest.raises(exc, match=msg):
        CUDA.paged_cross_attention(**a)
    assert torch.isnan(a["out"][0]).all()  # the bad token's rows are poisoned
    b = small_cross_args(kv_dtype)
    ops.paged_cross_attention(**b)  # the device is still usable (and ops dispatches to CUDA)
    torch.cuda.synchronize()
    assert not torch.isnan(b["out"]).any()
    assert bool((b["out"][1] == 0).all())


@gpu
def test_cross_host_checks_name_the_argument():
    a = small_cross_args()
    with pytest.raises(ValueError, match=r"kv_ranges must be \[num_tokens, 2\] = \[5, 2\]"):
        CUDA.paged_cross_attention(**{**a, "kv_ranges": a["kv_ranges"][:4]})
    with pytest.raises(ValueError, match="kv_ranges must be int32"):
        CUDA.paged_cross_attention(**{**a, "kv_ranges": a["kv_ranges"].long()})
    with pytest.raises(ValueError, match="kv_ranges"):  # on the CPU while the rest is on the GPU
        CUDA.paged_cross_attention(**{**a, "kv_ranges": a["kv_ranges"].cpu()})
