"""The avx512_bf16 engine (vdpbf16ps decode for bf16 / fp8 K/V) against the float64 reference.

Its q.k and p.v round the query and the probabilities to bf16, so outputs are checked against
the first-order bound of bf16_dot_reference.bf16_bound (derived there), not the exact engines'
u_out bound; a case with the query exactly representable and a power-of-two scale leaves only
the probability rounding, a bound about 10x tighter, which catches any element or token
mix-up. Also: every fp8 byte value (subnormals, the NaN byte), GQA groups 1..40 (more rows than
the engine converts at once), block sizes 1..256, head_dim 64..256 (and the tails it hands to
the avx512 engine), long contexts split across threads, prefill, block-sparse decode,
cross-attention key ranges, and bad input. Skipped where the CPU lacks AVX512_BF16 / AVX512_VBMI.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from bf16_dot_reference import bf16_bound
from cpu_engines import restore, use_engine
from cross_kernel_reference import random_ranges
from kernel_reference import FP8_TORCH, UNIT_ROUNDOFF, dequantize, make_paged_kv
from pagedllm import _core, ops
from sparse_kernel_reference import (
    flatten_lists,
    random_lists,
    sparse_attention_ref,
    to_csr,
)

ENGINE = "avx512_bf16"
ROUNDED = ["bf16", "fp8_e4m3", "fp8_e5m2"]  # the storage types this engine's kernel reads


@pytest.fixture(autouse=True)
def bf16_engine():
    use_engine(ENGINE)
    yield
    restore()


def check(out, q, kv, s, scale, positions, act, tight=False):
    """out (the rows of sequence s) within bf16_bound of the reference (tight: the bound with
    exact scores); returns the worst error as a fraction of the bound."""
    u_out = UNIT_ROUNDOFF[str(act).removeprefix("torch.")]
    ref, bound = bf16_bound(q, kv.k_full[s], kv.v_full[s], scale, positions, u_out, tight)
    assert not torch.isnan(out).any(), "NaN in the output (unwritten or poisoned data read)"
    err = (out.to(torch.float64) - ref).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"
    return (err / bound).max().item()


def run_decode(gen, lens, heads, kvh, head_dim, block_size, kv_dtype, act=torch.float32,
               k_scale=1.0, v_scale=1.0, q=None, scale=None):
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, k_scale, v_scale)
    if q is None:
        q = torch.randn((len(lens), heads, head_dim), generator=gen).to(act)
    out = torch.full((len(lens), heads, head_dim), float("nan"), dtype=act)
    scale = scale or 1.0 / math.sqrt(head_dim)
    _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, scale, kv_dtype, k_scale, v_scale)
    return kv, q, out, scale


def check_decode(*args, tight=False, **kw):
    kv, q, out, scale = run_decode(*args, **kw)
    act = out.dtype
    return max(check(out[s:s + 1], q[s:s + 1], kv, s, scale, torch.tensor([n - 1]), act, tight)
               for s, n in enumerate(kv.context_lens.tolist()))


def _scales(kv_dtype):
    return (0.45, 1.6) if kv_dtype.startswith("fp8") else (1.0, 1.0)


@pytest.mark.parametrize("kv_dtype", ROUNDED)
# (128, 64): 64 heads' bf16 query rows fill the lockstep buffer exactly; (256, 64) overflow it
# (one task per head); (65, 65): more heads than one lockstep call takes. Groups 1 to 4 and 6
# (tiles of 4 and 2 rows) reach every register tile height, whose scores land by masked stores.
@pytest.mark.parametrize("heads,kvh", [(8, 8), (32, 8), (32, 4), (12, 4), (12, 2), (16, 1),
                                       (40, 1), (128, 64), (256, 64), (65, 65)])
def test_decode_gqa_ratios(kv_dtype, heads, kvh):
    gen = torch.Generator().manual_seed(heads * 10 + kvh)
    ks, vs = _scales(kv_dtype)
    check_decode(gen, [1, 2, 16, 17, 100, 513], heads, kvh, 128, 16, kv_dtype, k_scale=ks,
                 v_scale=vs)


@pytest.mark.parametrize("kv_dtype", ROUNDED)
@pytest.mark.parametrize("head_dim", [64, 96, 160, 256])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_decode_head_dims_and_block_sizes(kv_dtype, head_dim, block_size):
    """head_dim % 64 == 32 (the last 32-element block), several blocks per chunk or one."""
    gen = torch.Generator().manual_seed(head_dim + block_size)
    ks, vs = _scales(kv_dtype)
    lens = [1, block_size, block_size + 1, 2 * block_size + 3, 300]
    check_decode(gen, lens, 8, 2, head_dim, block_size, kv_dtype, k_scale=ks, v_scale=vs)
    check_decode(gen, lens[:3], 4, 4, head_dim, block_size, kv_dtype, torch.bfloat16,
                 k_scale=ks, v_scale=vs)


@pytest.mark.parametrize("kv_dtype", ROUNDED)
def test_exact_query_leaves_only_probability_rounding(kv_dtype):
    """q in bf16 and scale 1/8: the scores are exact, so the much tighter bound must hold."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn((4, 16, 64), generator=gen).to(torch.bfloat16).float()
    worst = check_decode(gen, [7, 64, 129, 700], 16, 4, 64, 16, kv_dtype, q=q, scale=0.125,
                         tight=True)
    assert worst > 0.0


@pytest.mark.parametrize("kv_dtype", ROUNDED)
def test_bf16_query_scores_are_exact_at_any_scale(kv_dtype):
    """The query goes into the dot products unscaled (the scale and fp8 factors multiply the
    fp32 scores), so a bf16 query keeps the tight bound at 1/sqrt(head_dim), split-K too. The
    query is large (4 x randn: scores of order 10) so that rounding q * scale to bf16 would
    break the tight bound (it did before the scale moved onto the scores)."""
    gen = torch.Generator().manual_seed(6)
    ks, vs = _scales(kv_dtype)
    for act in (torch.float32, torch.bfloat16):
        q = (4 * torch.randn((4, 32, 128), generator=gen)).to(torch.bfloat16).to(act)
        worst = check_decode(gen, [5, 130, 1000, 4500], 32, 8, 128, 16, kv_dtype, act,
                             k_scale=ks, v_scale=vs, q=q, tight=True)
        assert worst > 0.0


def test_long_context_split_across_threads():
    """> 8k tokens, batch 1: split-K partitions merged, at 1, 2 and 3 threads."""
    gen = torch.Generator().manual_seed(7)
    old = _core.get_num_threads()
    try:
        for n in [1, 2, 3]:
            _core.set_num_threads(n)
            check_decode(gen, [8300], 32, 8, 128, 16, "bf16")
            check_decode(gen, [9000], 8, 2, 128, 16, "fp8", k_scale=0.7, v_scale=0.9)
    finally:
        _core.set_num_threads(old)
    check_decode(gen, [8192, 3, 5000], 32, 8, 128, 16, "bf16", torch.bfloat16)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_every_fp8_byte_value(kv_dtype):
    """K and V hold every finite byte (zeros, subnormals, normals, the largest), exactly."""
    f8 = FP8_TORCH[kv_dtype]
    values = torch.arange(256, dtype=torch.uint8)
    finite = values[torch.isfinite(values.view(f8).float())]
    gen = torch.Generator().manual_seed(3)
    n, hd = 64, 128
    kv = make_paged_kv(gen, [n], 2, hd, 16, kv_dtype, torch.float32, 0.01, 0.02)
    # token t, kv head g, element d: finite[(t * 37 + g * 11 + d * 5) % len]: every byte
    idx = (torch.arange(n)[:, None, None] * 37 + torch.arange(2)[None, :, None] * 11 +
           torch.arange(hd)[None, None, :] * 5) % len(finite)
    k_st, v_st = finite[idx], finite[(idx + 101) % len(finite)]
    assert set(k_st.unique().tolist()) == set(finite.tolist())
    ids = kv.block_tables[0, : n // 16].long()
    pos = torch.arange(n)
    kv.key_cache[ids[pos // 16], :, pos % 16] = k_st
    kv.value_cache[ids[pos // 16], :, pos % 16] = v_st
    kv.k_full[0] = dequantize(k_st, kv_dtype, 0.01)
    kv.v_full[0] = dequantize(v_st, kv_dtype, 0.02)
    q = torch.randn((1, 8, hd), generator=gen)
    out = torch.full_like(q, float("nan"))
    _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, 0.05, kv_dtype, 0.01, 0.02)
    check(out, q, kv, 0, 0.05, torch.tensor([n - 1]), torch.float32)


@pytest.mark.parametrize("kv_dtype,nan_byte", [("fp8_e4m3", 0x7F), ("fp8_e5m2", 0xFF),
                                               ("bf16", float("nan"))])
def test_nan_elements_read_as_nan_like_the_avx512_engine(kv_dtype, nan_byte):
    """A NaN in V reaches exactly that element of its KV head's outputs; a NaN in K, whatever
    the avx512 engine makes of it (its softmax max and exp skip a NaN score): same pattern."""
    for cache in ["key", "value"]:
        nans = {}
        for engine in [ENGINE, "avx512"]:
            _core.set_cpu_engine(engine)
            gen = torch.Generator().manual_seed(4)
            kv = make_paged_kv(gen, [40, 40], 2, 64, 16, kv_dtype, torch.float32)
            block = kv.block_tables[0, 1].item()  # token 20 of sequence 0, KV head 1
            getattr(kv, cache + "_cache")[block, 1, 4, 7] = nan_byte
            q = torch.randn((2, 4, 64), generator=gen)
            out = torch.full_like(q, float("nan"))
            _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                         kv.context_lens, 0.125, kv_dtype)
            nans[engine] = torch.isnan(out)
        assert torch.equal(nans[ENGINE], nans["avx512"]), cache
        if cache == "value":
            expected = torch.zeros_like(nans[ENGINE])
            expected[0, 2:, 7] = True  # the heads of KV head 1, element 7
            assert torch.equal(nans[ENGINE], expected)


@pytest.mark.parametrize("kv_dtype", ["auto", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 72])
def test_other_types_and_head_dims_are_the_avx512_engine(kv_dtype, head_dim):
    """fp32 / fp16 K/V, and any head_dim for them, run the exact avx512 engine: same bits."""
    gen = torch.Generator().manual_seed(head_dim)
    kv, q, out, scale = run_decode(gen, [5, 300], 8, 2, head_dim, 16, kv_dtype)
    _core.set_cpu_engine("avx512")
    exact = torch.full_like(out, float("nan"))
    _core.paged_attention_decode(exact, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, scale, kv_dtype)
    assert torch.equal(out, exact)


@pytest.mark.parametrize("kv_dtype", ROUNDED)
@pytest.mark.parametrize("head_dim", [40, 72, 200])
def test_head_dims_not_a_multiple_of_32_are_the_avx512_engine(kv_dtype, head_dim):
    gen = torch.Generator().manual_seed(head_dim + 1)
    ks, vs = _scales(kv_dtype)
    kv, q, out, scale = run_decode(gen, [3, 100], 6, 2, head_dim, 16, kv_dtype, k_scale=ks,
                                   v_scale=vs)
    _core.set_cpu_engine("avx512")
    exact = torch.full_like(out, float("nan"))
    _core.paged_attention_decode(exact, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, scale, kv_dtype, ks, vs)
    assert torch.equal(out, exact)


@pytest.mark.parametrize("kv_dtype", ROUNDED)
def test_prefill_within_the_bound(kv_dtype):
    """Prefill rows (causal limits inside a chunk, chunked prompts) on this engine."""
    gen = torch.Generator().manual_seed(12)
    ks, vs = _scales(kv_dtype)
    lens, q_lens = [9, 150, 300], [3, 70, 1]
    kv = make_paged_kv(gen, lens, 2, 128, 16, kv_dtype, torch.float32, ks, vs)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    q = torch.randn((int(cu[-1]), 8, 128), generator=gen)
    out = torch.full_like(q, float("nan"))
    scale = 1.0 / math.sqrt(128)
    _core.paged_attention_prefill(out, q, kv.key_cache, kv.value_cache, kv.block_tables, cu,
                                  kv.context_lens, scale, kv_dtype, ks, vs)
    for s, (n, ql) in enumerate(zip(lens, q_lens)):
        a, b = int(cu[s]), int(cu[s + 1])
        check(out[a:b], q[a:b], kv, s, scale, torch.arange(n - ql, n), torch.float32)


def test_bad_input_is_the_same_error_and_leaves_the_engine_usable():
    gen = torch.Generator().manual_seed(13)
    kv, q, out, scale = run_decode(gen, [5, 9], 8, 2, 64, 4, "bf16")
    bad = torch.full_like(kv.block_tables, 99)
    with pytest.raises(IndexError, match="outside the pool"):
        _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, bad,
                                     kv.context_lens, scale, "bf16")
    with pytest.raises(ValueError, match="k_scale"):
        _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                     kv.context_lens, scale, "bf16", -1.0)
    assert _core.get_cpu_engine() == ENGINE
    out.fill_(float("nan"))
    _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, scale, "bf16")
    for s, n in enumerate([5, 9]):
        check(out[s:s + 1], q[s:s + 1], kv, s, scale, torch.tensor([n - 1]), torch.float32)


def test_rounding_error_is_of_the_order_of_bf16_output_rounding():
    """The engine really rounds (fp32 activations: errors far above the exact engine's), and
    what it costs is of the order of rounding the output to bf16: with bf16 activations its
    error is within 3x of the exact avx512 engine's (measured 1.4x; docs/ARCHITECTURE.md)."""
    gen = torch.Generator().manual_seed(14)
    for act in [torch.float32, torch.bfloat16]:
        kv, q, out, scale = run_decode(gen, [2048] * 2, 32, 8, 128, 16, "bf16", act)
        _core.set_cpu_engine("avx512")
        exact = torch.full_like(out, float("nan"))
        _core.paged_attention_decode(exact, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                     kv.context_lens, scale, "bf16")
        _core.set_cpu_engine(ENGINE)
        for s in range(2):
            check(out[s:s + 1], q[s:s + 1], kv, s, scale, torch.tensor([2047]), act)
        ref = torch.cat([bf16_bound(q[s:s + 1], kv.k_full[s], kv.v_full[s], scale,
                                    torch.tensor([2047]), 0.0)[0] for s in range(2)])
        err = (out.double() - ref).abs().max().item()
        err_exact = (exact.double() - ref).abs().max().item()
        if act == torch.float32:
            assert err > 100 * err_exact
        else:
            assert err <= 3 * err_exact, (err, err_exact)


@pytest.mark.parametrize("kv_dtype", ROUNDED)
@pytest.mark.parametrize("block_size,per_head", [(1, True), (16, False), (16, True), (64, True)])
def test_block_sparse_decode_within_the_bound(kv_dtype, block_size, per_head):
    """Block-sparse decode runs this engine over compacted tables: per KV head, the bound of
    attention over the listed tokens only (its reference equals the masked one)."""
    rng = random.Random(block_size * 2 + per_head)
    gen = torch.Generator().manual_seed(block_size)
    ks, vs = _scales(kv_dtype)
    lens, heads, kvh, hd = [1, 3 * block_size + 5, 700], 8, 2, 128
    kv = make_paged_kv(gen, lens, kvh, hd, block_size, kv_dtype, torch.float32, ks, vs)
    lists = random_lists(rng, lens, kvh, block_size, per_head)
    indptr, indices = to_csr(flatten_lists(lists, per_head))
    q = torch.randn((len(lens), heads, hd), generator=gen)
    out = torch.full_like(q, float("nan"))
    scale = 1.0 / math.sqrt(hd)
    _core.paged_attention_decode_sparse(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                        kv.context_lens, indptr, indices, scale, kv_dtype, ks, vs)
    group = heads // kvh
    for s, n in enumerate(lens):
        masked = sparse_attention_ref(q[s:s + 1], kv.k_full[s], kv.v_full[s], scale,
                                      torch.tensor([n - 1]), lists[s], block_size)
        for h in range(kvh):
            tokens = torch.tensor([t for b in lists[s][h] for t in
                                   range(b * block_size, min(n, (b + 1) * block_size))])
            rows = slice(h * group, (h + 1) * group)
            ref, bound = bf16_bound(q[s:s + 1, rows], kv.k_full[s][tokens, h:h + 1],
                                    kv.v_full[s][tokens, h:h + 1], scale,
                                    torch.tensor([len(tokens) - 1]), 2.0 ** -24)
            assert torch.allclose(ref, masked[:, rows], rtol=1e-12, atol=1e-12)
            err = (out[s:s + 1, rows].double() - ref).abs()
            assert (err <= bound).all(), (err - bound).max().item()


@pytest.mark.parametrize("kv_dtype", ROUNDED)
@pytest.mark.parametrize("block_size", [1, 16])
def test_cross_attention_key_ranges_within_the_bound(kv_dtype, block_size):
    """paged_cross_attention's per-token key ranges [lo, hi) (row_start / row_limit): each row
    within the bound of attention over its range; empty ranges give exact zeros."""
    rng = random.Random(block_size)
    gen = torch.Generator().manual_seed(21 + block_size)
    ks, vs = _scales(kv_dtype)
    lens, heads, kvh, hd = [300, 40], 8, 2, 128
    kv = make_paged_kv(gen, lens, kvh, hd, block_size, kv_dtype, torch.float32, ks, vs)
    ranges = [random_ranges(rng, 9, n) for n in lens]
    cu = torch.tensor([0, 9, 18], dtype=torch.int32)
    kv_ranges = torch.tensor([r for rs in ranges for r in rs], dtype=torch.int32)
    q = torch.randn((18, heads, hd), generator=gen)
    out = torch.full_like(q, float("nan"))
    scale = 1.0 / math.sqrt(hd)
    ops.paged_cross_attention(out, q, kv.key_cache, kv.value_cache, kv.block_tables, cu,
                              kv.context_lens, kv_ranges, scale, kv_dtype, ks, vs)
    for s in range(2):
        for i, (lo, hi) in enumerate(ranges[s]):
            row = 9 * s + i
            if lo == hi:
                assert bool((out[row] == 0).all())
                continue
            ref, bound = bf16_bound(q[row:row + 1], kv.k_full[s][lo:hi], kv.v_full[s][lo:hi],
                                    scale, torch.tensor([hi - lo - 1]), 2.0 ** -24)
            err = (out[row:row + 1].double() - ref).abs()
            assert (err <= bound).all(), ((lo, hi), (err - bound).max().item())
