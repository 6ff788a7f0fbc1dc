"""The CUDA block-sparse attention kernels (pagedllm._core.cuda.paged_attention_*_sparse)
against the float64 reference masking the same blocks, the all-blocks case against the CUDA
dense kernels, and device-side list checks. Backend-generic: `test_harness_self_check` runs the
same checks on the CPU kernels so they are exercised without a GPU; the rest are marked `gpu`
(skipped where no GPU is visible, see conftest.py)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from kernel_reference import make_paged_kv, random_lens
from sparse_kernel_reference import flatten_lists, random_lists, sparse_attention_ref, to_csr
from test_kernels_attention import assert_close
from pagedllm import _core

gpu = pytest.mark.gpu
CUDA = getattr(_core, "cuda", None)
KV_DTYPES = ["auto", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]


def check_sparse(mod, device, seed, kv_dtype, heads, kvh, head_dim, block_size, per_head):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ks, vs = (0.5, 1.5) if kv_dtype.startswith("fp8") else (1.0, 1.0)
    lens = random_lens(rng, block_size, 4) + [3000]  # the long one is split-K on a GPU
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, torch.float32, ks, vs)
    lists = random_lists(rng, lens, kvh, block_size, per_head)
    indptr, indices = to_csr(flatten_lists(lists, per_head))
    dev = lambda t: t.to(device)  # noqa: E731
    n = len(lens)
    q = torch.randn((n, heads, head_dim), generator=gen)
    out = torch.full_like(q, float("nan"))
    scale = 1.0 / math.sqrt(head_dim)
    args = (dev(kv.key_cache), dev(kv.value_cache), dev(kv.block_tables), dev(kv.context_lens))
    o = dev(out)
    mod.paged_attention_decode_sparse(o, dev(q), *args, dev(indptr), dev(indices), scale,
                                      kv_dtype, ks, vs)
    for s, length in enumerate(lens):
        ref = sparse_attention_ref(q[s:s + 1], kv.k_full[s], kv.v_full[s], scale,
                                   torch.tensor([length - 1]), lists[s], block_size)
        assert_close(o[s:s + 1].cpu(), ref)
    # prefill rows (SIMT path on the GPU) over the same lists
    q_lens = [min(n_tok, rng.choice([1, 7, 40])) for n_tok in lens]
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    qp = torch.randn((int(cu[-1]), heads, head_dim), generator=gen)
    op = dev(torch.full_like(qp, float("nan")))
    mod.paged_attention_prefill_sparse(op, dev(qp), args[0], args[1], args[2], dev(cu), args[3],
                                       dev(indptr), dev(indices), scale, kv_dtype, ks, vs)
    for s, (length, ql) in enumerate(zip(lens, q_lens)):
        a, b = int(cu[s]), int(cu[s + 1])
        pos = torch.arange(length - ql, length)
        ref = sparse_attention_ref(qp[a:b], kv.k_full[s], kv.v_full[s], scale, pos, lists[s],
                                   block_size)
        assert_close(op[a:b].cpu(), ref)
    # all blocks == dense
    every = [list(range(-(-m // block_size))) for m in lens]
    ip, ix = to_csr(every)
    dense, sparse = dev(torch.empty_like(q)), dev(torch.empty_like(q))
    mod.paged_attention_decode(dense, dev(q), *args, scale, kv_dtype, ks, vs)
    mod.paged_attention_decode_sparse(sparse, dev(q), *args, dev(ip), dev(ix), scale, kv_dtype,
                                      ks, vs)
    assert torch.equal(dense.cpu(), sparse.cpu())


def test_harness_self_check():
    check_sparse(_core, "cpu", 1, "bf16", 8, 2, 128, 16, per_head=True)


@gpu
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("heads,kvh", [(8, 8), (8, 2), (16, 1)])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_cuda_sparse_matches_reference(kv_dtype, heads, kvh, block_size):
    if CUDA is None:
        pytest.skip("built without CUDA")
    for per_head in (False, True):
        check_sparse(CUDA, "cuda", block_size + kvh, kv_dtype, heads, kvh, 128, block_size,
                     per_head)


@gpu
@pytest.mark.parametrize("indices,match", [([0, 5, 1], "outside the sequence's blocks"),
                                           ([1, 0, 0], "strictly increasing")])
def test_cuda_bad_lists(indices, match):
    if CUDA is None:
        pytest.skip("built without CUDA")
    gen = torch.Generator().manual_seed(2)
    kv = make_paged_kv(gen, [40, 17], 2, 64, 16, "auto", torch.float32)
    q = torch.randn((2, 4, 64), generator=gen).cuda()
    with pytest.raises((ValueError, IndexError), match=match):
        CUDA.paged_attention_decode_sparse(
            torch.empty_like(q), q, kv.key_cache.cuda(), kv.value_cache.cuda(),
            kv.block_tables.cuda(), kv.context_lens.cuda(),
            torch.tensor([0, 2, 3], dtype=torch.int32).cuda(),
            torch.tensor(indices, dtype=torch.int32).cuda(), 0.125)
