"""Which engine "auto" decodes on: the best exact one, except a bf16 query on a bf16 or fp8
cache; and how "auto" prefills a bf16 model.

A bf16 query (a bf16 model's) is exact in bf16, so on bf16 and fp8 caches "auto" takes the
avx512_bf16 engine's dot products where the CPU has them (only the probabilities are rounded to
bf16, as a bf16 model's attention rounds them). Everything else, and every engine named by
set_cpu_engine / PAGEDLLM_CPU_ENGINE, decodes as that engine does. Checked bit for bit against
the engines forced by name, and against the float64 reference at each engine's bound.

Prefill of a bf16 query on a bf16 or fp8 cache under "auto", on a CPU with AVX512_BF16: the
avx512 tile rounds the probabilities to bf16 and multiplies them by V with vdpbf16ps too (head
dims that are multiples of 16); checked at the bound with exact scores. A named engine stays
exact.
"""

from __future__ import annotations

import math

import pytest
import torch
from bf16_dot_reference import bf16_bound
from cpu_engines import restore
from kernel_reference import UNIT_ROUNDOFF, attention_ref, make_paged_kv
from pagedllm import _core
from test_kernels_attention import assert_close

HAS_BF16_DOT = "avx512_bf16" in _core.cpu_engines()
# The avx512 engine's prefill tile takes vdpbf16ps with AVX512_BF16 alone.
HAS_BF16_TILE = ("avx512" in _core.cpu_engines()
                 and "avx512bf16" in _core.build_info()["cpu_features"])
LENS = [1, 17, 300, 2100]  # 2100 at batch 4: split-K partitions on 2+ threads


@pytest.fixture(autouse=True)
def auto_engine():
    _core.set_cpu_engine("auto")
    yield
    restore()


def decode(kv, q, kv_dtype, engine, k_scale=0.6, v_scale=1.3):
    """paged_attention_decode under `engine` ('auto' or a name); out [seqs, heads, hd]."""
    _core.set_cpu_engine(engine)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    _core.paged_attention_decode(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, 1.0 / math.sqrt(q.shape[-1]), kv_dtype,
                                 k_scale, v_scale)
    return out


def case(kv_dtype, act, seed, k_scale=0.6, v_scale=1.3):
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(gen, LENS, 8, 128, 16, kv_dtype, act, k_scale, v_scale)
    q = torch.randn((len(LENS), 32, 128), generator=gen).to(act)
    return kv, q


def best_exact():
    return _core.cpu_engines()[0]


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2", "bf16"])
def test_bf16_query_on_rounded_caches_decodes_with_bf16_dot_products(kv_dtype):
    if not HAS_BF16_DOT:
        pytest.skip("this CPU lacks AVX512_BF16 / AVX512_VBMI: auto stays exact")
    kv, q = case(kv_dtype, torch.bfloat16, 1)
    auto = decode(kv, q, kv_dtype, "auto")
    assert torch.equal(auto, decode(kv, q, kv_dtype, "avx512_bf16"))
    assert not torch.equal(auto, decode(kv, q, kv_dtype, best_exact()))
    # Within the bound with exact scores: only the probabilities were rounded.
    scale = 1.0 / math.sqrt(128)
    for s, n in enumerate(LENS):
        ref, bound = bf16_bound(q[s:s + 1], kv.k_full[s], kv.v_full[s], scale,
                                torch.tensor([n - 1]), UNIT_ROUNDOFF["bfloat16"], True)
        assert ((auto[s:s + 1].double() - ref).abs() <= bound).all(), f"sequence {s}"


@pytest.mark.parametrize("kv_dtype,act", [("fp8_e4m3", torch.float32), ("fp8_e5m2", torch.float32),
                                          ("bf16", torch.float32), ("auto", torch.float32),
                                          ("fp16", torch.bfloat16)])
def test_other_queries_and_caches_stay_on_the_exact_engine(kv_dtype, act):
    kv, q = case(kv_dtype, act, 2)
    assert torch.equal(decode(kv, q, kv_dtype, "auto"), decode(kv, q, kv_dtype, best_exact()))


def test_a_named_engine_is_used_as_named():
    """set_cpu_engine(the best exact engine) keeps a bf16 query on fp8 on that engine: exact,
    so within the exact engines' bound, and (with AVX512_BF16) not auto's bf16 dot products."""
    kv, q = case("fp8_e4m3", torch.bfloat16, 3)
    named = decode(kv, q, "fp8_e4m3", best_exact())
    assert _core.get_cpu_engine() == best_exact()
    for s, n in enumerate(LENS):
        ref = attention_ref(q[s:s + 1], kv.k_full[s], kv.v_full[s], 1.0 / math.sqrt(128),
                            torch.tensor([n - 1]))
        assert_close(named[s:s + 1], ref)
    if HAS_BF16_DOT:
        assert not torch.equal(named, decode(kv, q, "fp8_e4m3", "auto"))


def test_head_dims_the_bf16_kernel_does_not_take_stay_exact():
    """head_dim 48 (not a multiple of 32): auto's bf16 query on fp8 is the exact engine's."""
    gen = torch.Generator().manual_seed(4)
    kv = make_paged_kv(gen, [40, 300], 2, 48, 16, "fp8_e4m3", torch.bfloat16, 0.6, 1.3)
    q = torch.randn((2, 8, 48), generator=gen).to(torch.bfloat16)
    assert torch.equal(decode(kv, q, "fp8_e4m3", "auto"),
                       decode(kv, q, "fp8_e4m3", best_exact()))


def prefill(kv, q, cu, kv_dtype, engine, k_scale, v_scale):
    """paged_attention_prefill under `engine`; out [tokens, heads, hd]."""
    _core.set_cpu_engine(engine)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    _core.paged_attention_prefill(out, q, kv.key_cache, kv.value_cache, kv.block_tables, cu,
                                  kv.context_lens, 1.0 / math.sqrt(q.shape[-1]), kv_dtype,
                                  k_scale, v_scale)
    return out


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("heads,kvh,head_dim", [(8, 2, 32), (16, 4, 64), (32, 8, 128),
                                                (4, 4, 48), (16, 2, 40)])
def test_bf16_model_prefill_rounds_probabilities(kv_dtype, heads, kvh, head_dim):
    """Whole prompts, chunks after a context at odd and even offsets; head_dim 40 keeps exact
    p.v (not a multiple of 16) after bf16 dot-product scores."""
    gen = torch.Generator().manual_seed(heads + head_dim + len(kv_dtype))
    fp8 = kv_dtype.startswith("fp8")
    k_scale, v_scale = (0.6, 1.7) if fp8 else (1.0, 1.0)
    lens, q_lens = [1, 33, 81, 300, 130], [1, 33, 40, 71, 64]
    kv = make_paged_kv(gen, lens, kvh, head_dim, 16, kv_dtype, torch.bfloat16, k_scale, v_scale)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    q = torch.randn((int(cu[-1]), heads, head_dim), generator=gen).to(torch.bfloat16)
    auto = prefill(kv, q, cu, kv_dtype, "auto", k_scale, v_scale)
    scale = 1.0 / math.sqrt(head_dim)
    for s, (n, q_len) in enumerate(zip(lens, q_lens)):
        a, b = int(cu[s]), int(cu[s + 1])
        ref, bound = bf16_bound(q[a:b], kv.k_full[s], kv.v_full[s], scale,
                                torch.arange(n - q_len, n), UNIT_ROUNDOFF["bfloat16"], True)
        assert ((auto[a:b].double() - ref).abs() <= bound).all(), f"sequence {s}"
    exact = prefill(kv, q, cu, kv_dtype, best_exact(), k_scale, v_scale)
    if HAS_BF16_TILE and head_dim % 16 == 0:
        assert not torch.equal(auto, exact)  # the probabilities were rounded
    else:
        assert torch.equal(auto, exact)


def test_fp32_model_prefill_stays_exact():
    """A float32 query (an fp32 model's) on a bf16 cache: auto's prefill is the exact engine's."""
    gen = torch.Generator().manual_seed(9)
    kv = make_paged_kv(gen, [70, 300], 4, 64, 16, "bf16", torch.float32, 1.0, 1.0)
    cu = torch.tensor([0, 70, 370], dtype=torch.int32)
    q = torch.randn((370, 16, 64), generator=gen)
    assert torch.equal(prefill(kv, q, cu, "bf16", "auto", 1.0, 1.0),
                       prefill(kv, q, cu, "bf16", best_exact(), 1.0, 1.0))
