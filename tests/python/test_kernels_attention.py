"""paged_attention_decode / paged_attention_prefill against a float64 torch reference.

Every case: fresh random K/V written into randomly permuted blocks (unused cache slots and table
entries poisoned), outputs poisoned with NaN before the call, every CPU engine. Error bound per element: |out - ref| <= u_out * |ref| + 1e-5 * max(1, max|ref|), where
u_out is the unit roundoff of the output dtype (the reference uses the exact stored K/V, so the
storage dtype adds no error beyond that; fp8 against unquantized K/V is tested separately).
Every test taking `kernel` runs once per CPU engine (avx512, avx2, generic) this CPU has.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from cpu_engines import ENGINES, OPT_IN_ENGINES, restore, use_engine
from kernel_reference import UNIT_ROUNDOFF, attention_ref, make_paged_kv, random_lens
from pagedllm import _core

HEAD_DIMS = [64, 80, 96, 128, 256]
BLOCK_SIZES = [1, 2, 8, 16, 32, 64, 256]
KV_DTYPES = ["auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"]
ACT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GROUPS = [(8, 8), (8, 2), (32, 4), (16, 2), (8, 1), (32, 1)]  # (num_heads, num_kv_heads)


@pytest.fixture(params=ENGINES)
def kernel(request):
    """Runs the test once per CPU engine (those this machine lacks are skipped)."""
    use_engine(request.param)
    yield request.param
    restore()


# The random matrices: 12 seeds on the widest engine, fewer on the others.
MATRIX = ([("avx512", s) for s in range(12)] + [("avx2", s) for s in range(8)] +
          [("generic", s) for s in range(6)])


@pytest.fixture
def matrix_kernel(request):
    use_engine(request.param)
    yield request.param
    restore()


def assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    u = UNIT_ROUNDOFF[str(out.dtype).removeprefix("torch.")]
    out64 = out.to(torch.float64)
    assert not torch.isnan(out64).any(), "output has NaN (unwritten or poisoned data read)"
    bound = u * ref.abs() + 1e-5 * max(1.0, ref.abs().max().item())
    err = (out64 - ref).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"


def run_decode(gen, lens, heads, kvh, head_dim, block_size, kv_dtype, act, k_scale=1.0,
               v_scale=1.0, pool_layers=0, strided_query=False):
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, k_scale, v_scale,
                       pool_layers=pool_layers)
    n = len(lens)
    if strided_query:  # query as a slice of a fused qkv projection: token stride > heads * dim
        qkv = torch.randn((n, heads + 2 * kvh, head_dim), generator=gen).to(act)
        q = qkv[:, :heads]
    else:
        q = torch.randn((n, heads, head_dim), generator=gen).to(act)
    out = torch.full((n, heads, head_dim), float("nan"), dtype=act)
    scale = 1.0 / math.sqrt(head_dim)
    _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, scale, kv_dtype, k_scale, v_scale)
    for s, length in enumerate(lens):
        ref = attention_ref(q[s:s + 1], kv.k_full[s], kv.v_full[s], scale,
                            torch.tensor([length - 1]))
        assert_close(out[s:s + 1], ref)


def run_prefill(gen, lens, q_lens, heads, kvh, head_dim, block_size, kv_dtype, act,
                k_scale=1.0, v_scale=1.0, pool_layers=0, strided=False):
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, k_scale, v_scale,
                       pool_layers=pool_layers)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    total = int(cu[-1])
    if strided:  # query sliced from a fused qkv, out a slice of a wider buffer
        q = torch.randn((total, heads + 2 * kvh, head_dim), generator=gen).to(act)[:, :heads]
        wide = torch.full((total, heads + 3, head_dim), float("nan"), dtype=act)
        out = wide[:, 1:heads + 1]
    else:
        q = torch.randn((total, heads, head_dim), generator=gen).to(act)
        out = torch.full((total, heads, head_dim), float("nan"), dtype=act)
    scale = 1.0 / math.sqrt(head_dim)
    _core.paged_attention_prefill(out, q, kv.key_cache, kv.value_cache, kv.block_tables, cu,
                                  kv.context_lens, scale, kv_dtype, k_scale, v_scale)
    for s, (length, q_len) in enumerate(zip(lens, q_lens)):
        a, b = int(cu[s]), int(cu[s + 1])
        if a == b:
            continue
        pos = torch.arange(length - q_len, length)
        assert_close(out[a:b], attention_ref(q[a:b], kv.k_full[s], kv.v_full[s], scale, pos))


def random_config(rng: random.Random):
    heads, kvh = rng.choice(GROUPS)
    return dict(heads=heads, kvh=kvh, head_dim=rng.choice(HEAD_DIMS),
                block_size=rng.choice(BLOCK_SIZES), kv_dtype=rng.choice(KV_DTYPES),
                act=rng.choice(ACT_DTYPES))


@pytest.mark.parametrize("matrix_kernel,seed", MATRIX, indirect=["matrix_kernel"])
def test_decode_random_matrix(matrix_kernel, seed):
    rng = random.Random(1000 + seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        cfg = random_config(rng)
        fp8 = cfg["kv_dtype"].startswith("fp8")
        run_decode(gen, random_lens(rng, cfg["block_size"], rng.randint(1, 5)), cfg["heads"],
                   cfg["kvh"], cfg["head_dim"], cfg["block_size"], cfg["kv_dtype"], cfg["act"],
                   k_scale=0.37 if fp8 else 1.0, v_scale=1.9 if fp8 else 1.0,
                   pool_layers=rng.choice([0, 0, 3]), strided_query=rng.random() < 0.3)


@pytest.mark.parametrize("matrix_kernel,seed", MATRIX, indirect=["matrix_kernel"])
def test_prefill_random_matrix(matrix_kernel, seed):
    rng = random.Random(2000 + seed)
    gen = torch.Generator().manual_seed(100 + seed)
    for _ in range(3):
        cfg = random_config(rng)
        fp8 = cfg["kv_dtype"].startswith("fp8")
        lens = random_lens(rng, cfg["block_size"], rng.randint(1, 4))
        # whole prompts, chunks of a prompt, prefix-cache hits (few new tokens), decode-like.
        q_lens = [min(160, rng.choice([n, max(1, n // 2), min(n, rng.randint(1, 40)), 1, 0]))
                  for n in lens]
        run_prefill(gen, lens, q_lens, cfg["heads"], cfg["kvh"], cfg["head_dim"],
                    cfg["block_size"], cfg["kv_dtype"], cfg["act"],
                    k_scale=0.5 if fp8 else 1.0, v_scale=2.0 if fp8 else 1.0,
                    pool_layers=rng.choice([0, 2]), strided=rng.random() < 0.3)


@pytest.mark.parametrize("heads,kvh", [(8, 8), (32, 8), (32, 4), (16, 1)])
@pytest.mark.parametrize("kv_dtype", ["auto", "bf16", "fp8"])
def test_decode_gqa_ratios(kernel, heads, kvh, kv_dtype):
    gen = torch.Generator().manual_seed(heads * 10 + kvh)
    run_decode(gen, [1, 16, 17, 100, 512], heads, kvh, 128, 16, kv_dtype, torch.float32,
               k_scale=0.8, v_scale=1.3)


@pytest.mark.parametrize("kvh", [2, 64, 65])
@pytest.mark.parametrize("kv_dtype", ["auto", "bf16", "fp8"])
def test_decode_kv_heads_in_lockstep(kernel, kvh, kv_dtype):
    """Decode runs each sequence's 2-64 KV heads in lockstep (EngineOps::attend_heads), more
    than 64 one task per head: both against the reference, with lengths from 1 token to one
    split into partitions, a bf16 query (the avx512_bf16 decode under "auto") and an fp32 one."""
    gen = torch.Generator().manual_seed(kvh)
    lens = [1, 33, 700, 2, 161]
    for act in (torch.float32, torch.bfloat16):
        run_decode(gen, lens, kvh, kvh, 32, 16, kv_dtype, act, k_scale=0.8, v_scale=1.3)
        run_decode(gen, [1500], 2 * kvh, kvh, 64, 8, kv_dtype, act)


@pytest.mark.parametrize("block_size", [1, 256])
@pytest.mark.parametrize("head_dim", [80, 96, 256])
def test_edge_sizes(kernel, block_size, head_dim):
    gen = torch.Generator().manual_seed(block_size + head_dim)
    lens = [1, block_size, block_size + 1, 2 * block_size, 300]
    run_decode(gen, lens, 4, 2, head_dim, block_size, "auto", torch.float32)
    q_lens = [min(q, n) for q, n in zip([1, block_size, 1, 7, 300], lens)]
    run_prefill(gen, lens, q_lens, 4, 2, head_dim, block_size, "auto", torch.float32)


@pytest.mark.parametrize("head_dim", [16, 32])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("heads,kvh", [(8, 2), (8, 8), (16, 2), (4, 1)])
def test_small_heads(kernel, head_dim, kv_dtype, heads, kvh):
    """head_dim 16 and 32 (the "tiny" preset's: one or two vectors per row, for 16 lanes); GQA
    groups 1, 4, 8 (register tiles of 1, 4 and 8 rows), contexts ending inside a 16-token
    stretch, block sizes 16 and 3, split-K, and the row-major prefill of small tasks."""
    gen = torch.Generator().manual_seed(head_dim * 7 + heads + kvh)
    fp8 = kv_dtype.startswith("fp8")
    ks, vs = (0.6, 1.7) if fp8 else (1.0, 1.0)
    lens = [1, 7, 16, 17, 33, 130, 2100]
    run_decode(gen, lens, heads, kvh, head_dim, 16, kv_dtype, torch.float32, k_scale=ks,
               v_scale=vs)
    run_decode(gen, lens[:5], heads, kvh, head_dim, 3, kv_dtype, torch.bfloat16, k_scale=ks,
               v_scale=vs)
    q_lens = [1, 2, 3, 1, 5, 2, 1]  # a few rows per task: attend_task, not the prefill tile
    run_prefill(gen, lens, q_lens, heads, kvh, head_dim, 16, kv_dtype, torch.float32,
                k_scale=ks, v_scale=vs)


@pytest.mark.parametrize("head_dim", [8, 24, 40, 72, 136, 200, 264, 512])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_head_dim_tails(kernel, head_dim, kv_dtype):
    """head_dim not a multiple of 16 (the 16-lane engine's 8-element tails) nor of 32 (its
    32-element wide loads), GQA groups of 3 and 1, partial last blocks, decode and prefill."""
    gen = torch.Generator().manual_seed(head_dim)
    fp8 = kv_dtype.startswith("fp8")
    ks, vs = (0.6, 1.7) if fp8 else (1.0, 1.0)
    lens = [1, 15, 16, 17, 70]  # block 16: partial, exact and one-past last blocks
    run_decode(gen, lens, 6, 2, head_dim, 16, kv_dtype, torch.float32, k_scale=ks, v_scale=vs)
    run_decode(gen, lens[:3], 2, 2, head_dim, 5, kv_dtype, torch.bfloat16, k_scale=ks,
               v_scale=vs)
    q_lens = [1, 15, 3, 17, 9]
    run_prefill(gen, lens, q_lens, 6, 2, head_dim, 16, kv_dtype, torch.float32, k_scale=ks,
                v_scale=vs)


def test_long_context_single_sequence(kernel):
    """> 8k tokens, batch 1: the decode is split across threads and merged."""
    gen = torch.Generator().manual_seed(7)
    for kv_dtype in ["auto", "fp8"]:
        run_decode(gen, [8300], 8, 2, 128, 16, kv_dtype, torch.float32, k_scale=0.7,
                   v_scale=0.9)
    run_decode(gen, [8192, 3, 5000], 32, 8, 128, 16, "bf16", torch.bfloat16)
    run_prefill(gen, [8250], [40], 8, 2, 128, 16, "auto", torch.float32)


def test_long_context_single_thread_matches(kernel):
    """Partitioning depends on the thread count; every count must give the right answer."""
    gen = torch.Generator().manual_seed(8)
    old = _core.get_num_threads()
    try:
        for n in [1, 3]:
            _core.set_num_threads(n)
            run_decode(gen, [2100], 8, 8, 64, 16, "auto", torch.float32)
    finally:
        _core.set_num_threads(old)


def test_whole_prompt_prefill_matches_decode_rows(kernel):
    """Prefill of a full prompt == decode of each prefix, row for row (same kernel family)."""
    gen = torch.Generator().manual_seed(9)
    run_prefill(gen, [64, 33], [64, 33], 8, 2, 64, 16, "auto", torch.float32)


def test_context_zero_gives_zeros(kernel):
    gen = torch.Generator().manual_seed(10)
    kv = make_paged_kv(gen, [5, 1], 2, 64, 4, "auto", torch.float32)
    kv.context_lens[1] = 0
    q = torch.randn((2, 4, 64), generator=gen)
    out = torch.full_like(q, float("nan"))
    _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, 0.125)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert_close(out[:1], attention_ref(q[:1], kv.k_full[0], kv.v_full[0], 0.125,
                                        torch.tensor([4])))


@pytest.mark.parametrize("kv_dtype,fmt", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"),
                                          ("bf16", "bfloat16"), ("fp16", "float16")])
def test_storage_error_matches_format_precision(kernel, kv_dtype, fmt):
    """Against unquantized float64 K/V, the error of a reduced-precision cache scales with the
    format's unit roundoff u: bounded by 8 u max|v|, and not orders of magnitude below it."""
    gen = torch.Generator().manual_seed(11)
    heads, kvh, d, bs = 8, 2, 128, 16
    lens = [200, 333]
    kv = make_paged_kv(gen, lens, kvh, d, bs, kv_dtype, torch.float32, 0.05, 0.04)
    exact = make_paged_kv(torch.Generator().manual_seed(11), lens, kvh, d, bs, "auto",
                          torch.float32)
    q = torch.randn((len(lens), heads, d), generator=gen)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(d)
    _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, scale, kv_dtype, 0.05, 0.04)
    u = UNIT_ROUNDOFF[fmt]
    for s, n in enumerate(lens):
        ref = attention_ref(q[s:s + 1], exact.k_full[s], exact.v_full[s], scale,
                            torch.tensor([n - 1]))
        err = (out[s:s + 1].double() - ref).abs().max().item()
        vmax = exact.v_full[s].abs().max().item()
        assert err <= 8 * u * vmax, (err, u, vmax)
        assert err >= u * vmax / 1000, "error implausibly small: was the cache really reduced?"


@pytest.mark.parametrize("engine", ENGINES + OPT_IN_ENGINES)
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("kv_dtype,act,poison", [
    ("auto", torch.float32, float("nan")), ("bf16", torch.bfloat16, float("nan")),
    ("fp8_e4m3", torch.float32, 0x7F),  # e4m3's NaN byte
])
def test_a_nan_key_makes_the_output_nan_on_every_engine(engine, kernel, kv_dtype, act, poison):
    # The SIMD engines' exp clamped a NaN score to a weight of ~0: the corrupted token was
    # silently dropped (and a NaN query gave a finite, engine-dependent output), where the
    # portable engine and a float64 reference give NaN.
    use_engine(engine)
    try:
        gen = torch.Generator().manual_seed(0)
        L, D = 40, 64
        kv = make_paged_kv(gen, [L], 1, D, 16, kv_dtype, act)
        kv.key_cache[int(kv.block_tables[0, 0]), 0, 5, 3] = poison  # token 5, element 3
        rows = 1 if kernel == "decode" else 20
        q = torch.randn((rows, 4, D), generator=gen).to(act)
        out = torch.zeros((rows, 4, D), dtype=act)
        if kernel == "decode":
            _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                         kv.context_lens, 0.125, kv_dtype)
        else:  # the last 20 tokens: every row sees token 5
            _core.paged_attention_prefill(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                          torch.tensor([0, rows], dtype=torch.int32),
                                          kv.context_lens, 0.125, kv_dtype)
        assert torch.isnan(out).all()
        q[0, 0, 0] = float("nan")  # a NaN query: its head's output is NaN too
        kv.key_cache[int(kv.block_tables[0, 0]), 0, 5, 3] = 0
        out.zero_()
        if kernel == "decode":
            _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                         kv.context_lens, 0.125, kv_dtype)
        else:
            _core.paged_attention_prefill(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                          torch.tensor([0, rows], dtype=torch.int32),
                                          kv.context_lens, 0.125, kv_dtype)
        assert torch.isnan(out[0, 0]).all()
        assert not torch.isnan(out[0, 1:]).any() and not torch.isnan(out[1:]).any()
    finally:
        restore()
