"""The GEMM-shaped prefill tile (cpp/src/kernels/engine_prefill_impl.h) at its edges, against
the float64 reference of test_kernels_attention, on every CPU engine this machine has (the
portable one has no tile: there these check its row-major prefill, which gets the query
unscaled too).

A prefill task holds up to 64 query rows (tokens x GQA group, token-major); the tile puts them
in the lanes of row vectors of 16 (avx512) or 8 (avx2, generic) and walks the context in key
tiles of 64 tokens. Tasks of fewer rows than one vector take the row-major kernel instead, so
the q lens below cover both sides of that switch, partial row vectors and partial tasks (q lens
not multiples of 8, 16 or 64 / group), contexts that end inside a key tile, and chunks that
start after a context (chunked prefill, prefix-cache hits) inside a key tile or a block.
"""

from __future__ import annotations

import pytest
import torch

from cpu_engines import ENGINES, restore, use_engine
from test_kernels_attention import run_prefill


@pytest.fixture(params=ENGINES)
def kernel(request):
    use_engine(request.param)
    yield request.param
    restore()


# (context length, query tokens at its end): whole prompts, then chunks after a context.
WHOLE = [(1, 1), (3, 3), (7, 7), (8, 8), (9, 9), (17, 17), (31, 31), (32, 32), (33, 33),
         (63, 63), (64, 64), (65, 65), (127, 127), (130, 130)]
CHUNKED = [(40, 5), (45, 13), (100, 37), (64, 32), (97, 64), (129, 65), (300, 71)]
GROUPS = [(4, 4), (8, 2), (16, 2)]  # (heads, kv heads): GQA ratios 1, 4, 8


def split(cases):
    return [n for n, _ in cases], [q for _, q in cases]


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("heads,kvh", GROUPS)
def test_fp32_tile_edges(kernel, heads, kvh, block_size):
    gen = torch.Generator().manual_seed(heads * 100 + kvh * 10 + block_size)
    for cases in (WHOLE, CHUNKED):
        lens, q_lens = split(cases)
        run_prefill(gen, lens, q_lens, heads, kvh, 128, block_size, "auto", torch.float32)


@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("heads,kvh", GROUPS)
def test_reduced_storage_tile_edges(kernel, heads, kvh, kv_dtype):
    """Each key tile is converted once into float32 scratch; fp8 with non-trivial scales."""
    gen = torch.Generator().manual_seed(heads + kvh)
    fp8 = kv_dtype.startswith("fp8")
    lens, q_lens = split(WHOLE[5:] + CHUNKED)
    run_prefill(gen, lens, q_lens, heads, kvh, 64, 16, kv_dtype, torch.float32,
                k_scale=0.6 if fp8 else 1.0, v_scale=1.7 if fp8 else 1.0)


@pytest.mark.parametrize("head_dim", [8, 32, 40, 72, 136, 512])
def test_head_dim_tails_and_extremes(kernel, head_dim):
    """head_dim under 4 vectors (8, 32, 40: the narrow value tile), with an 8-element tail for 16
    lanes (40, 72, 136), and the largest."""
    gen = torch.Generator().manual_seed(head_dim)
    lens, q_lens = split([(33, 33), (70, 17), (129, 64)])
    run_prefill(gen, lens, q_lens, 8, 2, head_dim, 16, "bf16", torch.float32)
    run_prefill(gen, lens, q_lens, 8, 8, head_dim, 8, "auto", torch.float32)


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_reduced_activations(kernel, act):
    gen = torch.Generator().manual_seed(5)
    lens, q_lens = split(CHUNKED + WHOLE[-3:])
    run_prefill(gen, lens, q_lens, 16, 2, 128, 16, "auto", act)
    run_prefill(gen, lens, q_lens, 16, 2, 128, 16, "bf16", act)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("head_dim", [40, 64, 128])
def test_bf16_query_on_fp8_cache(kernel, kv_dtype, head_dim):
    """A bf16 query on an fp8 cache: with AVX512_BF16 the avx512 tile converts each key tile to
    bf16 (exactly) and scores by vdpbf16ps, still at the exact engines' bound; head_dim 40
    takes the 8-element tail of that conversion."""
    gen = torch.Generator().manual_seed(head_dim + len(kv_dtype))
    lens, q_lens = split(WHOLE[6:] + CHUNKED)
    run_prefill(gen, lens, q_lens, 16, 4, head_dim, 16, kv_dtype, torch.bfloat16,
                k_scale=0.6, v_scale=1.7)


def test_strided_query_and_output_long_context(kernel):
    """A fused-qkv query slice, an output slice, a pool of layers, and a context of 3000."""
    gen = torch.Generator().manual_seed(6)
    run_prefill(gen, [3000, 500], [200, 500], 32, 8, 128, 16, "auto", torch.float32,
                pool_layers=2, strided=True)
