"""paged_cross_attention (Mllama's cross-attention) against a float64 torch reference.

Every case: random cross K/V written into randomly permuted blocks (unused slots and table
entries poisoned with NaN / -7), outputs poisoned with NaN before the call, key ranges per query
token (empty, whole, prefix, inner, suffix; runs of tokens sharing one), decode-like (one token
per sequence) and prefill-like packing mixed in one call. Tests taking `kernel` run once per CPU
engine (avx512, avx2, generic) this CPU has. The error bound is test_kernels_attention's.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from cpu_engines import ENGINES, restore, use_engine
from cross_kernel_reference import cross_attention_ref, random_ranges
from kernel_reference import make_paged_kv
from pagedllm import _core, ops
from test_kernels_attention import assert_close

HEAD_DIMS = [64, 80, 128, 256]
BLOCK_SIZES = [1, 8, 16, 32, 256]
KV_DTYPES = ["auto", "bf16", "fp8", "fp8_e5m2"]
ACT_DTYPES = [torch.float32, torch.bfloat16]
GROUPS = [(8, 8), (8, 2), (32, 4), (8, 1)]  # (num_heads, num_kv_heads)


@pytest.fixture(params=ENGINES)
def kernel(request):
    """Runs the test once per CPU engine (those this machine lacks are skipped)."""
    use_engine(request.param)
    yield request.param
    restore()


def run_cross(gen, lens, ranges_per_seq, heads, kvh, head_dim, block_size, kv_dtype, act,
              k_scale=1.0, v_scale=1.0, pool_layers=0, strided=False):
    """One call over sequences with cross contexts `lens` and per-token ranges; checks every
    output row against the reference (and that empty-range rows are exactly zero). strided:
    the query is a slice of a wider projection and out a slice of a wider buffer."""
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, k_scale, v_scale,
                       pool_layers=pool_layers)
    q_lens = [len(r) for r in ranges_per_seq]
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens, dtype=torch.int32).cumsum(0)
    total = int(cu[-1])
    flat = [r for rs in ranges_per_seq for r in rs]
    kv_ranges = torch.tensor(flat, dtype=torch.int32).reshape(total, 2)
    if strided:
        q = torch.randn((total, heads + 2 * kvh, head_dim), generator=gen).to(act)[:, :heads]
        out = torch.full((total, heads + 3, head_dim), float("nan"), dtype=act)[:, 1:heads + 1]
    else:
        q = torch.randn((total, heads, head_dim), generator=gen).to(act)
        out = torch.full((total, heads, head_dim), float("nan"), dtype=act)
    scale = 1.0 / math.sqrt(head_dim)
    ops.paged_cross_attention(out, q, kv.key_cache, kv.value_cache, kv.block_tables, cu,
                              kv.context_lens, kv_ranges, scale, kv_dtype, k_scale, v_scale)
    for s in range(len(lens)):
        a, b = int(cu[s]), int(cu[s + 1])
        if a == b:
            continue
        ref = cross_attention_ref(q[a:b], kv.k_full[s], kv.v_full[s], scale, kv_ranges[a:b])
        assert_close(out[a:b], ref)
        empty = kv_ranges[a:b, 0] == kv_ranges[a:b, 1]
        assert bool((out[a:b][empty] == 0).all()), "an empty range must give an exact zero row"
    return out


# The random matrices: more seeds on the widest engine, fewer on the others.
MATRIX = ([("avx512", s) for s in range(8)] + [("avx2", s) for s in range(6)] +
          [("generic", s) for s in range(5)])


@pytest.fixture
def matrix_kernel(request):
    use_engine(request.param)
    yield request.param
    restore()


@pytest.mark.parametrize("matrix_kernel,seed", MATRIX, indirect=["matrix_kernel"])
def test_cross_random_matrix(matrix_kernel, seed):
    rng = random.Random(3000 + seed)
    gen = torch.Generator().manual_seed(300 + seed)
    for _ in range(3):
        heads, kvh = rng.choice(GROUPS)
        block_size = rng.choice(BLOCK_SIZES)
        kv_dtype = rng.choice(KV_DTYPES)
        fp8 = kv_dtype.startswith("fp8")
        num_seqs = rng.randint(1, 4)
        lens = [rng.choice([0, 1, block_size, 7, rng.randint(1, 700)]) for _ in range(num_seqs)]
        # decode (1 token), prefill chunks, and a sequence with no query tokens at all
        q_lens = [rng.choice([1, 1, 0, rng.randint(1, 40), rng.randint(40, 130)]) for _ in lens]
        ranges = [random_ranges(rng, ql, n) for ql, n in zip(q_lens, lens)]
        run_cross(gen, lens, ranges, heads, kvh, rng.choice(HEAD_DIMS), block_size, kv_dtype,
                  rng.choice(ACT_DTYPES), k_scale=0.5 if fp8 else 1.0,
                  v_scale=2.0 if fp8 else 1.0, pool_layers=rng.choice([0, 2]),
                  strided=rng.random() < 0.3)


@pytest.mark.parametrize("kv_dtype", ["auto", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16, torch.float16])
def test_cross_dtypes(kernel, kv_dtype, act):
    gen = torch.Generator().manual_seed(7)
    lens = [300, 45]
    ranges = [[(0, 300)] * 5 + [(17, 190)] * 3 + [(0, 0)], [(0, 45)]]
    fp8 = kv_dtype.startswith("fp8")
    run_cross(gen, lens, ranges, 16, 4, 128, 16, kv_dtype, act,
              k_scale=0.25 if fp8 else 1.0, v_scale=3.0 if fp8 else 1.0)


@pytest.mark.parametrize("heads,kvh", GROUPS + [(64, 1), (2, 2)])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_cross_gqa_and_block_sizes(kernel, heads, kvh, block_size):
    gen = torch.Generator().manual_seed(heads * 1000 + kvh * 10 + block_size)
    rng = random.Random(heads + kvh + block_size)
    lens = [257, 16, 1]
    ranges = [random_ranges(rng, 70, 257), [(0, 16)], [(0, 1), (1, 1)]]
    run_cross(gen, lens, ranges, heads, kvh, 64, block_size, "auto", torch.float32)


def test_cross_ranges_empty_partial_full(kernel):
    """Each kind of range on its own row, in one tile: rows with different ranges share K/V
    chunks, and a row's range may start and end inside a chunk or a block."""
    gen = torch.Generator().manual_seed(11)
    n = 600
    ranges = [(0, 0), (0, n), (0, 1), (n - 1, n), (129, 130), (5, 517), (128, 256), (n, n),
              (300, 300), (1, n)]
    run_cross(gen, [n], [ranges], 8, 2, 80, 16, "auto", torch.float32)


def test_cross_all_empty_gives_zeros(kernel):
    """Every row empty (text-only tokens, or a context of 0): the output is exactly zero and
    no cache memory is read (the caches are NaN-poisoned where unwritten)."""
    gen = torch.Generator().manual_seed(12)
    out = run_cross(gen, [0, 40], [[(0, 0)] * 3, [(40, 40), (0, 0)]], 8, 8, 64, 16, "auto",
                    torch.bfloat16)
    assert bool((out == 0).all())


def test_cross_mixed_decode_and_prefill(kernel):
    """Decode rows (one per sequence) and prefill chunks packed in one call, images of several
    sequences of different lengths: tokens see the union of consecutive images."""
    gen = torch.Generator().manual_seed(13)
    img = 1601 // 4  # a small "tile" of patches
    lens = [2 * img, img, 4 * img, 0]
    ranges = [
        [(0, 2 * img)],                                         # decode: both images
        [(0, 0)] * 2 + [(0, img)] * 60,                         # text before, then the image
        [(0, img)] * 10 + [(img, 4 * img)] * 30 + [(0, 4 * img)],  # image 1, then images 2-4
        [(0, 0)],                                               # text-only request
    ]
    run_cross(gen, lens, ranges, 32, 8, 128, 16, "bf16", torch.bfloat16)


def test_cross_matches_prefill_over_whole_context(kernel):
    """With every range (0, context) the kernel is full non-causal attention: the last query
    token of a causal prefill over the same cache sees the same keys."""
    gen = torch.Generator().manual_seed(14)
    kv = make_paged_kv(gen, [333], 4, 64, 16, "auto", torch.float32)
    q = torch.randn((1, 8, 64), generator=gen)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    ranges = torch.tensor([[0, 333]], dtype=torch.int32)
    out_cross = torch.full_like(q, float("nan"))
    out_prefill = torch.full_like(q, float("nan"))
    ops.paged_cross_attention(out_cross, q, kv.key_cache, kv.value_cache, kv.block_tables, cu,
                              kv.context_lens, ranges, 0.125)
    ops.paged_attention_prefill(out_prefill, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                cu, kv.context_lens, 0.125)
    torch.testing.assert_close(out_cross, out_prefill, rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 8])
def test_cross_split_k_over_long_contexts(kernel, threads):
    """Few (tile, KV head) pairs over long cross contexts: with 8 threads the key ranges are
    split into partitions whose partials are merged (with 1, one partition); rows whose range
    misses some partitions, or all of them, still match."""
    before = _core.get_num_threads()
    _core.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(16 + threads)
        n = 4 * 1601
        run_cross(gen, [n, 900], [[(0, n), (0, 0), (3000, 3001), (100, 5000)], [(0, 900)]],
                  8, 2, 128, 16, "bf16", torch.bfloat16)
        run_cross(gen, [n], [[(0, n)]], 32, 8, 64, 32, "fp8", torch.float32, k_scale=0.5)
    finally:
        _core.set_num_threads(before)


def test_cross_no_tokens_is_a_no_op():
    gen = torch.Generator().manual_seed(15)
    kv = make_paged_kv(gen, [20], 2, 64, 16, "auto", torch.float32)
    q = torch.empty((0, 4, 64))
    out = torch.empty((0, 4, 64))
    _core.paged_cross_attention(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                torch.tensor([0, 0], dtype=torch.int32), kv.context_lens,
                                torch.empty((0, 2), dtype=torch.int32), 0.1)


def test_cross_text_only_batch_with_an_empty_pool():
    """A batch where no request has an image: no cross blocks at all (an empty pool, a table
    with no columns), every range empty; the output is exactly zero."""
    q = torch.randn((3, 8, 64))
    out = torch.full_like(q, float("nan"))
    empty_pool = torch.zeros((0, 2, 16, 64))
    ops.paged_cross_attention(out, q, empty_pool, empty_pool.clone(),
                              torch.zeros((2, 0), dtype=torch.int32),
                              torch.tensor([0, 2, 3], dtype=torch.int32),
                              torch.zeros(2, dtype=torch.int32),
                              torch.zeros((3, 2), dtype=torch.int32), 0.125)
    assert bool((out == 0).all())
