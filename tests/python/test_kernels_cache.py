"""reshape_and_cache, the storage conversions, copy_blocks and swap_blocks.

Conversions are checked bit for bit against torch's round-to-nearest-even casts (fp8: of the
value divided by the scale, clamped to the format's max: the kernel saturates), on random values
plus every tie, neighbour and special value of each format. fp8 decoding is checked on all 256
bytes through the attention kernels themselves (a context of one token returns its value row).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_engines import ENGINES, restore, use_engine
from kernel_reference import FP8_TORCH, quantize, storage_torch_dtype
from pagedllm import _core

ACT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(params=ENGINES)
def kernel(request):
    """Runs the test once per CPU engine (those this machine lacks are skipped)."""
    use_engine(request.param)
    yield request.param
    restore()


def special_values(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of a small float format with its midpoints and float32 neighbours,
    plus overflow, infinities, NaN and values below the smallest subnormal (float32)."""
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    else:  # 16-bit: a strided sample of all codes is plenty (and every subnormal code)
        codes = torch.cat([torch.arange(0, 65536, 7), torch.arange(0, 1024)]).to(torch.int32)
        codes = codes.to(torch.int16).view(dtype).float()
    codes = codes[torch.isfinite(codes)].unique()
    mids = (codes[1:].double() + codes[:-1].double()) / 2
    mids = mids.float()  # ties (exactly representable in float32 for these formats)
    up = torch.nextafter(mids, torch.tensor(float("inf")))
    down = torch.nextafter(mids, torch.tensor(float("-inf")))
    big = torch.tensor([float(torch.finfo(dtype).max) * f for f in (1.01, 1.06, 1.5, 4.0)])
    extras = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-45, float("inf"), float("-inf"),
                           3.4e38, -3.4e38])
    return torch.cat([codes, mids, up, down, big, -big, extras])


@pytest.mark.parametrize("kv_dtype,target", [("fp8_e4m3", torch.float8_e4m3fn),
                                             ("fp8_e5m2", torch.float8_e5m2),
                                             ("fp16", torch.float16), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_conversion_bit_exact(kv_dtype, target, scale):
    x = special_values(target)
    if not kv_dtype.startswith("fp8"):
        scale = 1.0  # the scale applies to fp8 only
    head_dim = 8
    pad = (-x.numel()) % head_dim
    x = torch.cat([x, torch.zeros(pad)]).reshape(-1, 1, head_dim)
    n = x.shape[0]
    cache_dtype = storage_torch_dtype(kv_dtype, torch.float32)
    kc = torch.zeros((n, 1, 1, head_dim), dtype=cache_dtype)
    vc = torch.zeros_like(kc)
    slots = torch.arange(n, dtype=torch.int64)
    _core.reshape_and_cache(x, -x, kc, vc, slots, kv_dtype, scale, scale)
    for got, src in [(kc, x), (vc, -x)]:
        want = quantize(src, kv_dtype, torch.float32, scale)
        got_bits = got.reshape(n, 1, head_dim)
        if kv_dtype.startswith("fp8"):
            got_vals = got_bits.view(FP8_TORCH[kv_dtype]).float()
            want_vals = want.view(FP8_TORCH[kv_dtype]).float()
        else:
            got_vals, want_vals = got_bits.float(), want.float()
        nan = torch.isnan(want_vals)
        assert torch.equal(torch.isnan(got_vals), nan)
        assert torch.equal(got_vals[~nan], want_vals[~nan])
        # signed zeros and every other code bit for bit
        bits = (torch.uint8 if kv_dtype.startswith("fp8") else torch.int16)
        assert torch.equal(got_bits.view(bits)[~nan], want.view(bits)[~nan])


@pytest.mark.parametrize("fp8", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_decode_all_bytes(kernel, fp8):
    """Decode of every fp8 byte: a one-token context returns its value row times v_scale."""
    head_dim = 256
    kc = torch.zeros((1, 1, 1, head_dim), dtype=torch.uint8)
    vc = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 1, head_dim)
    q = torch.randn((1, 1, head_dim))
    for v_scale in [1.0, 0.25]:
        out = torch.full_like(q, 7.0)
        _core.paged_attention_decode(out, q, kc, vc, torch.zeros((1, 1), dtype=torch.int32),
                                     torch.ones(1, dtype=torch.int32), 1.0, fp8, 1.0, v_scale)
        want = torch.arange(256, dtype=torch.uint8).view(FP8_TORCH[fp8]).float() * v_scale
        got = out.reshape(-1)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan], want[~nan])


@pytest.mark.parametrize("cache", ["fp16", "bf16"])
def test_half_decode_all_codes(kernel, cache):
    dtype = torch.float16 if cache == "fp16" else torch.bfloat16
    codes = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    codes = codes[torch.isfinite(codes.float())].reshape(-1)
    head_dim = 256
    n = codes.numel() // head_dim
    vc = codes[: n * head_dim].reshape(n, 1, 1, head_dim)
    kc = torch.zeros_like(vc)
    q = torch.randn((n, 1, head_dim))
    out = torch.empty_like(q)
    tables = torch.arange(n, dtype=torch.int32).reshape(n, 1)
    _core.paged_attention_decode(out, q, kc, vc, tables, torch.ones(n, dtype=torch.int32), 1.0,
                                 cache)
    assert torch.equal(out.reshape(n, head_dim), vc.reshape(n, head_dim).float())


@pytest.mark.parametrize("act", ACT_DTYPES)
@pytest.mark.parametrize("kv_dtype", ["auto", "fp16", "bf16", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_reshape_and_cache_slots(act, kv_dtype, slot_dtype):
    """Tokens land in their slots (converted), -1 slots are skipped, all else is untouched;
    key/value may be strided views (slices of a fused qkv) and caches pool views."""
    gen = torch.Generator().manual_seed(3)
    kvh, d, bs, nb = 2, 64, 16, 9
    n = 40
    qkv = torch.randn((n, 4 + 2 * kvh, d), generator=gen).to(act)
    key, value = qkv[:, 4:4 + kvh], qkv[:, 4 + kvh:]
    cache_dtype = storage_torch_dtype(kv_dtype, act)
    pool = torch.randint(0, 100, (nb, 3, 2, kvh, bs, d), generator=gen).to(cache_dtype)
    before = pool.clone()
    kc, vc = pool[:, 1, 0], pool[:, 1, 1]
    slots = torch.randperm(nb * bs, generator=gen)[:n].to(slot_dtype)
    slots[::7] = -1
    k_scale, v_scale = (0.5, 0.125) if kv_dtype.startswith("fp8") else (1.0, 1.0)
    _core.reshape_and_cache(key, value, kc, vc, slots, kv_dtype, k_scale, v_scale)
    expect = before.clone()
    live = slots >= 0
    s = slots[live].long()
    expect[s // bs, 1, 0, :, s % bs] = quantize(key[live], kv_dtype, act, k_scale)
    expect[s // bs, 1, 1, :, s % bs] = quantize(value[live], kv_dtype, act, v_scale)
    if cache_dtype.is_floating_point:
        assert torch.equal(pool.view(torch.int16 if pool.element_size() == 2 else torch.int32),
                           expect.view(torch.int16 if pool.element_size() == 2 else torch.int32))
    else:
        assert torch.equal(pool, expect)


def test_reshape_and_cache_numpy():
    key = np.arange(2 * 1 * 8, dtype=np.float32).reshape(2, 1, 8)
    kc = np.zeros((2, 1, 4, 8), dtype=np.float32)
    vc = np.zeros_like(kc)
    _core.reshape_and_cache(key, key * 2, kc, vc, np.array([5, 0], dtype=np.int64))
    assert np.array_equal(kc[1, 0, 1], key[0, 0]) and np.array_equal(vc[0, 0, 0], 2 * key[1, 0])


def test_copy_blocks_pool_and_layers():
    """Copy-on-write over a whole block-major pool and over per-layer views."""
    gen = torch.Generator().manual_seed(4)
    pool = torch.randn((6, 2, 2, 2, 4, 8), generator=gen)
    before = pool.clone()
    pairs = torch.tensor([[0, 3], [2, 5], [4, 4]], dtype=torch.int32)
    _core.copy_blocks([pool], pairs)
    expect = before.clone()
    expect[3], expect[5] = before[0], before[2]
    assert torch.equal(pool, expect)
    # per-layer views: only that layer's K and V move
    views = [pool[:, 1, 0], pool[:, 1, 1]]
    before = pool.clone()
    _core.copy_blocks(views, torch.tensor([[1, 0]], dtype=torch.int64))
    expect = before.clone()
    expect[0, 1] = before[1, 1]
    assert torch.equal(pool, expect)
    _core.copy_blocks([pool], torch.zeros((0, 2), dtype=torch.int32))  # no pairs: no-op
    assert torch.equal(pool, expect)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_swap_blocks_between_pools(dtype):
    gen = torch.Generator().manual_seed(5)
    dev = torch.randint(0, 200, (5, 2, 3, 4), generator=gen).to(dtype)
    host = torch.zeros((7, 2, 3, 4), dtype=dtype)
    pairs = torch.tensor([[4, 0], [1, 6], [1, 2]], dtype=torch.int32)
    _core.swap_blocks(dev, host, pairs)
    assert torch.equal(host[0], dev[4]) and torch.equal(host[6], dev[1])
    assert torch.equal(host[2], dev[1]) and not host[[1, 3, 4, 5]].any()
    back = torch.zeros_like(dev)
    _core.swap_blocks(host, back, torch.tensor([[0, 4]], dtype=torch.int64))
    assert torch.equal(back[4], dev[4])
