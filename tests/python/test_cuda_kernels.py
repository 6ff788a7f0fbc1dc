"""The CUDA kernels (pagedllm._core.cuda) against the CPU kernels and a float64 reference.

Every GPU test is marked `gpu` (skipped cleanly where no GPU is visible, see conftest.py). Random
inputs over head dims, storage and activation dtypes, block sizes, GQA ratios, pool views with
a non-contiguous block dim, strided queries, cached prefixes and long contexts (split-K); caches'
unused slots and outputs are poisoned with NaN. The comparison logic lives in cuda_harness.py;
`test_harness_self_check` runs it against the CPU kernels so that it is exercised without a GPU.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from cuda_fixtures import CUDA, cuda_backend, stop_if_the_context_breaks  # noqa: F401 (fixtures)
from cuda_harness import CPU, run_decode, run_prefill
from kernel_reference import make_paged_kv, quantize, random_lens
from pagedllm import _core, ops

gpu = pytest.mark.gpu

HEAD_DIMS = [64, 80, 96, 128, 256]
BLOCK_SIZES = [1, 2, 8, 16, 32, 64, 256]
KV_DTYPES = ["auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"]
ACT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ACT_IDS = ["f32", "f16", "bf16"]
# (num_heads, num_kv_heads): MHA, GQA 3 / 4 / 5 / 8 / 12 (two head chunks), MQA up to 72 (72 > 64
# rows: prefill falls back to the split-K kernel). Decode blocks hold 1, 4 or 8 heads
# (decode_heads_per_block): groups 3 and 5 leave some of a block's heads unused.
GROUPS = [(8, 8), (12, 4), (8, 2), (20, 4), (32, 4), (16, 2), (8, 1), (32, 1), (24, 2), (64, 1),
          (72, 1)]


def random_config(rng: random.Random):
    heads, kvh = rng.choice(GROUPS)
    return dict(heads=heads, kvh=kvh, head_dim=rng.choice(HEAD_DIMS),
                block_size=rng.choice(BLOCK_SIZES), kv_dtype=rng.choice(KV_DTYPES),
                act=rng.choice(ACT_DTYPES))


def fp8_scales(rng: random.Random, kv_dtype: str):
    return (rng.choice([0.5, 1.0, 2.5]), rng.choice([0.25, 1.0, 3.0])) if kv_dtype.startswith(
        "fp8") else (1.0, 1.0)


# --- harness self-check (no GPU needed) ------------------------------------------------------

@pytest.mark.parametrize("seed", range(2))
def test_harness_self_check(seed):
    """The GPU tests' references and bounds accept the CPU kernels (so they test the kernels,
    not the harness)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = random_config(rng)
    lens = random_lens(rng, cfg["block_size"], 3)
    run_decode(CPU, gen, lens, **cfg, pool_layers=2, strided_query=True)
    q_lens = [rng.randint(0, n) for n in lens]
    run_prefill(CPU, gen, lens, q_lens, **cfg)


# --- attention ---------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("seed", range(16))
def test_decode_random_matrix(cuda_backend, seed):
    rng = random.Random(1000 + seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        cfg = random_config(rng)
        k_scale, v_scale = fp8_scales(rng, cfg["kv_dtype"])
        lens = random_lens(rng, cfg["block_size"], rng.randint(1, 9))
        run_decode(cuda_backend, gen, lens, **cfg, k_scale=k_scale, v_scale=v_scale,
                   pool_layers=rng.choice([0, 3]), strided_query=rng.random() < 0.3)


@gpu
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("act", ACT_DTYPES, ids=ACT_IDS)
def test_decode_every_head_dim_and_dtype(cuda_backend, head_dim, kv_dtype, act):
    gen = torch.Generator().manual_seed(head_dim)
    k_scale, v_scale = (2.0, 0.5) if kv_dtype.startswith("fp8") else (1.0, 1.0)
    run_decode(cuda_backend, gen, [1, 17, 300, 64], 16, 4, head_dim, 16, kv_dtype, act,
               k_scale, v_scale)


@gpu
@pytest.mark.parametrize("group", GROUPS, ids=[f"{h}x{k}" for h, k in GROUPS])
def test_decode_every_group(cuda_backend, group):
    # Each size of thread block (1, 4, 8 heads), full and partly used, and chunks of 8.
    gen = torch.Generator().manual_seed(100 * group[0] + group[1])
    run_decode(cuda_backend, gen, [5, 300, 1000], group[0], group[1], 128, 16, "bf16",
               torch.bfloat16)


@gpu
@pytest.mark.parametrize("lens", [[20000], [5000, 1, 7777], [70000]])
@pytest.mark.parametrize("group", [(32, 8), (8, 1)])
def test_decode_long_contexts_split_k(cuda_backend, lens, group):
    gen = torch.Generator().manual_seed(len(lens))
    run_decode(cuda_backend, gen, lens, group[0], group[1], 128, 16, "bf16", torch.bfloat16)


@gpu
def test_decode_empty_context_gives_zeros(cuda_backend):
    gen = torch.Generator().manual_seed(0)
    kv = make_paged_kv(gen, [5, 1], 2, 64, 4, "auto", torch.float16)
    lens = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 4, 64, dtype=torch.float16, device="cuda")
    out = torch.full_like(q, float("nan"))
    CUDA.paged_attention_decode(out, q, kv.key_cache.cuda(), kv.value_cache.cuda(),
                                kv.block_tables.cuda(), lens, 0.125)
    torch.cuda.synchronize()
    assert torch.equal(out[0].cpu(), torch.zeros(4, 64, dtype=torch.float16))
    assert not torch.isnan(out[1]).any()


@gpu
@pytest.mark.parametrize("seed", range(16))
def test_prefill_random_matrix(cuda_backend, seed):
    rng = random.Random(2000 + seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(2):
        cfg = random_config(rng)
        k_scale, v_scale = fp8_scales(rng, cfg["kv_dtype"])
        lens = random_lens(rng, cfg["block_size"], rng.randint(1, 5))
        # whole prompts, chunks after a cached prefix, single tokens and empty chunks
        q_lens = [rng.choice([n, rng.randint(0, n), 1, 0]) for n in lens]
        run_prefill(cuda_backend, gen, lens, q_lens, **cfg, k_scale=k_scale, v_scale=v_scale,
                    pool_layers=rng.choice([0, 2]))


@gpu
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kv_dtype,act", [("auto", torch.float16), ("auto", torch.bfloat16),
                                          ("auto", torch.float32), ("fp8", torch.bfloat16),
                                          ("fp8_e5m2", torch.float16), ("bf16", torch.float32)],
                         ids=["auto-f16", "auto-bf16", "auto-f32", "fp8-bf16", "fp8_e5m2-f16",
                              "bf16-f32"])
@pytest.mark.parametrize("group", [(8, 8), (32, 8), (7, 1), (64, 1)],
                         ids=["g8x8", "g32x8", "g7x1", "g64x1"])
def test_prefill_every_head_dim_and_dtype(cuda_backend, head_dim, kv_dtype, act, group):
    gen = torch.Generator().manual_seed(head_dim + group[0])
    k_scale, v_scale = (1.5, 0.75) if kv_dtype.startswith("fp8") else (1.0, 1.0)
    run_prefill(cuda_backend, gen, [200, 77, 64, 1], [200, 30, 64, 1], group[0], group[1],
                head_dim, 16, kv_dtype, act, k_scale, v_scale)


@gpu
def test_prefill_long_prompt(cuda_backend):
    gen = torch.Generator().manual_seed(7)
    run_prefill(cuda_backend, gen, [3000, 2500], [3000, 900], 32, 8, 128, 16, "auto",
                torch.bfloat16)


# --- reshape_and_cache, copy_blocks, swap_blocks ------------------------------------------------

@gpu
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("act", ACT_DTYPES, ids=ACT_IDS)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_reshape_and_cache_matches_cpu_bit_for_bit(kv_dtype, act, slot_dtype):
    gen = torch.Generator().manual_seed(3)
    num_blocks, kvh, bs, hd = 6, 2, 16, 80
    from kernel_reference import storage_torch_dtype

    cache_dtype = storage_torch_dtype(kv_dtype, act)
    # scaled so that fp8 e4m3 saturates for some values (max 448)
    key = (torch.randn(40, kvh, hd, generator=gen) * 200).to(act)
    value = (torch.randn(40, kvh, hd, generator=gen) * 200).to(act)
    slots = torch.randperm(num_blocks * bs, generator=gen)[:40].to(slot_dtype)
    slots[::7] = -1
    k_scale, v_scale = (0.75, 1.25) if kv_dtype.startswith("fp8") else (1.0, 1.0)
    pool = torch.zeros(num_blocks, 3, 2, kvh, bs, hd, dtype=cache_dtype)
    cpu_k, cpu_v = pool[:, 1, 0], pool[:, 1, 1]
    _core.reshape_and_cache(key, value, cpu_k, cpu_v, slots, kv_dtype, k_scale, v_scale)
    gpool = torch.zeros_like(pool, device="cuda")
    CUDA.reshape_and_cache(key.cuda(), value.cuda(), gpool[:, 1, 0], gpool[:, 1, 1], slots.cuda(),
                           kv_dtype, k_scale, v_scale)
    torch.cuda.synchronize()
    assert torch.equal(gpool.cpu().view(torch.uint8), pool.view(torch.uint8))


@gpu
@pytest.mark.parametrize("pairs_on_gpu", [False, True])
def test_copy_blocks_matches_torch(pairs_on_gpu):
    gen = torch.Generator().manual_seed(4)
    pool = torch.randn(16, 2, 2, 4, 16, 64, generator=gen).to(torch.bfloat16).cuda()
    other = torch.randn(16, 33, generator=gen).cuda()  # 132-byte blocks: the bytewise path
    pairs = torch.tensor([[0, 5], [3, 9], [3, 10], [15, 1]], dtype=torch.int64)
    want_pool, want_other = pool.clone(), other.clone()
    want_pool[pairs[:, 1]] = pool[pairs[:, 0]]
    want_other[pairs[:, 1]] = other[pairs[:, 0]]
    CUDA.copy_blocks([pool, other], pairs.cuda() if pairs_on_gpu else pairs.to(torch.int32))
    torch.cuda.synchronize()
    assert torch.equal(pool, want_pool) and torch.equal(other, want_other)


@gpu
@pytest.mark.parametrize("direction", ["d2h_pinned", "h2d_pinned", "d2h_pageable", "d2d"])
def test_swap_blocks(direction):
    gen = torch.Generator().manual_seed(5)
    src_cpu = torch.randn(12, 2, 2, 4, 16, 64, generator=gen).to(torch.float16)
    pairs = torch.tensor([[0, 3], [1, 4], [2, 5], [7, 0], [11, 11]])
    if direction == "d2h_pinned":
        src, dst = src_cpu.cuda(), torch.zeros_like(src_cpu).pin_memory()
    elif direction == "h2d_pinned":
        src, dst = src_cpu.pin_memory(), torch.zeros_like(src_cpu, device="cuda")
    elif direction == "d2h_pageable":
        src, dst = src_cpu.cuda(), torch.zeros_like(src_cpu)
    else:
        src, dst = src_cpu.cuda(), torch.zeros_like(src_cpu, device="cuda")
    CUDA.swap_blocks(src, dst, pairs)
    torch.cuda.synchronize()
    got = dst.cpu()
    for s, d in pairs.tolist():
        assert torch.equal(got[d], src_cpu[s])
    untouched = sorted(set(range(12)) - {d for _, d in pairs.tolist()})
    assert torch.equal(got[untouched], torch.zeros_like(got[untouched]))


@gpu
def test_ops_dispatches_cuda_tensors():
    gen = torch.Generator().manual_seed(6)
    kv = make_paged_kv(gen, [33, 5], 2, 64, 16, "auto", torch.float16)
    q = torch.randn(2, 4, 64, generator=gen).to(torch.float16)
    out_cpu = torch.empty_like(q)
    ops.paged_attention_decode(out_cpu, q, kv.key_cache, kv.value_cache, kv.block_tables,
                               kv.context_lens, 0.125)
    out = torch.empty_like(q, device="cuda")
    ops.paged_attention_decode(out, q.cuda(), kv.key_cache.cuda(), kv.value_cache.cuda(),
                               kv.block_tables.cuda(), kv.context_lens.cuda(), 0.125)
    torch.cuda.synchronize()
    assert torch.allclose(out.cpu().float(), out_cpu.float(), atol=2e-3, rtol=2e-3)


# --- streams -----------------------------------------------------------------------------------

@gpu
def test_streams_order_swaps_with_compute():
    s = CUDA.Streams()
    assert s.owns_compute and s.compute_stream != 0 and s.copy_stream != 0
    pool = torch.zeros(8, 4096, device="cuda")
    host = torch.zeros(8, 4096).pin_memory()
    big = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()  # the allocations above ran on the default stream
    with ops.cuda_stream(s.compute_stream):
        for _ in range(20):  # keep the compute stream busy so the copy must really wait
            big = big @ big.T / 4096.0
        pool.fill_(3.0)
    t_compute = s.record_compute()
    t_out = s.swap_blocks_async(pool, host, torch.tensor([[0, 0], [5, 1]]), after=t_compute)
    assert s.pending_swaps == 1
    s.synchronize(t_out)
    assert s.done(t_out) and s.done(t_compute)
    assert torch.equal(host[:2], torch.full((2, 4096), 3.0))

    src = torch.full((8, 4096), 7.0).pin_memory()
    t_in = s.swap_blocks_async(src, pool, torch.tensor([[2, 4]]))
    s.compute_wait(t_in)
    with ops.cuda_stream(s.compute_stream):
        total = pool[4].sum()
    s.synchronize(s.record_compute())
    assert total.item() == 7.0 * 4096
    s.synchronize_all()
    assert s.pending_swaps == 0


@gpu
def test_streams_borrow_torch_stream_and_refuse_pageable_async():
    torch_stream = torch.cuda.current_stream().cuda_stream
    s = CUDA.Streams(0, torch_stream)
    assert not s.owns_compute and s.compute_stream == torch_stream
    with pytest.raises(ValueError, match="pinned host memory"):
        s.swap_blocks_async(torch.zeros(2, 8, device="cuda"), torch.zeros(2, 8),
                            torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="never issued"):
        s.compute_wait(10**9)
    assert s.record_copy() > 0


# --- errors ------------------------------------------------------------------------------------

def small_decode_args():
    gen = torch.Generator().manual_seed(8)
    kv = make_paged_kv(gen, [20, 3], 2, 64, 16, "auto", torch.float16)
    q = torch.randn(2, 4, 64, generator=gen).to(torch.float16).cuda()
    return dict(out=torch.empty_like(q), query=q, key_cache=kv.key_cache.cuda(),
                value_cache=kv.value_cache.cuda(), block_tables=kv.block_tables.cuda(),
                context_lens=kv.context_lens.cuda(), scale=0.125)


@gpu
def test_bad_block_id_raises_and_the_context_survives():
    a = small_decode_args()
    a["block_tables"][0, 1] = a["key_cache"].shape[0] + 5
    with pytest.raises(IndexError, match=r"block_tables\[0\]\[1\] = .* outside the pool"):
        CUDA.paged_attention_decode(**a)
    assert torch.isnan(a["out"][0]).all()  # the bad sequence is poisoned, not half-computed
    b = small_decode_args()
    CUDA.paged_attention_decode(**b)  # the device is still usable
    torch.cuda.synchronize()
    assert not torch.isnan(b["out"]).any()


@gpu
def test_bad_context_len_and_slot_raise():
    a = small_decode_args()
    a["context_lens"][1] = 10**6
    with pytest.raises(ValueError, match=r"context_lens\[1\] = 1000000 is outside"):
        CUDA.paged_attention_decode(**a)
    k = torch.randn(2, 2, 64, dtype=torch.float16, device="cuda")
    slots = torch.tensor([0, 10**7], dtype=torch.int64, device="cuda")
    with pytest.raises(IndexError, match=r"slot_mapping\[1\] = 10000000"):
        CUDA.reshape_and_cache(k, k, a["key_cache"], a["value_cache"], slots)


@gpu
def test_bad_cu_seqlens_raise():
    a = small_decode_args()
    cu = torch.tensor([0, 1, 5], dtype=torch.int32, device="cuda")  # 5 != 2 query tokens
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        CUDA.paged_attention_prefill(a["out"], a["query"], a["key_cache"], a["value_cache"],
                                     a["block_tables"], cu, a["context_lens"], 0.125)


@gpu
def test_deferred_validation_reports_at_check_errors():
    CUDA.set_validation("deferred")
    try:
        a = small_decode_args()
        a["block_tables"][1, 0] = -3
        CUDA.paged_attention_decode(**a)  # returns without waiting
        with pytest.raises(IndexError, match=r"block_tables\[1\]\[0\] = -3"):
            CUDA.check_errors(0)
        CUDA.check_errors(0)  # cleared
    finally:
        CUDA.set_validation("sync")


@gpu
def test_host_side_argument_errors():
    a = small_decode_args()
    with pytest.raises(ValueError, match="head_dim 72 is not compiled"):
        kc = torch.zeros(4, 2, 16, 72, dtype=torch.float16, device="cuda")
        q = torch.zeros(2, 4, 72, dtype=torch.float16, device="cuda")
        CUDA.paged_attention_decode(torch.empty_like(q), q, kc, kc, a["block_tables"],
                                    a["context_lens"], 0.1)
    with pytest.raises(ValueError, match="block_tables must be int32"):
        CUDA.paged_attention_decode(a["out"], a["query"], a["key_cache"], a["value_cache"],
                                    a["block_tables"].long(), a["context_lens"], 0.125)
    with pytest.raises(ValueError, match="is on cpu"):
        CUDA.paged_attention_decode(a["out"], a["query"], a["key_cache"], a["value_cache"],
                                    a["block_tables"].cpu(), a["context_lens"], 0.125)
    with pytest.raises(IndexError, match="outside the cache's blocks"):
        CUDA.copy_blocks([a["key_cache"]], torch.tensor([[0, 99]]))


@gpu
def test_device_queries():
    free, total = CUDA.mem_get_info(0)
    assert 0 < free <= total
    assert CUDA.compute_capability(0) >= 80
    assert CUDA.device_name(0) == torch.cuda.get_device_name(0)
