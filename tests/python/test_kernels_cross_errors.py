"""paged_cross_attention rejects bad input with an error naming the argument, before writing.

Each case starts from a valid call (2 sequences with 5 and 9 cross tokens in blocks of 4, 3 and
1 query tokens, 8 query / 2 KV heads, head_dim 64) and breaks one thing; the output tensor and
both caches must be unchanged afterwards, and the same tensors must then serve a valid call.
"""

from __future__ import annotations

import pytest
import torch

from cross_kernel_reference import cross_attention_ref
from kernel_reference import make_paged_kv
from pagedllm import _core, ops


def cross_args(**over):
    """Valid cross-attention arguments, with overrides."""
    gen = torch.Generator().manual_seed(0)
    kv = make_paged_kv(gen, [5, 9], 2, 64, 4, "auto", torch.float32)
    args = dict(out=torch.zeros((4, 8, 64)), query=torch.randn((4, 8, 64), generator=gen),
                key_cache=kv.key_cache, value_cache=kv.value_cache,
                block_tables=kv.block_tables, cu_seqlens_q=torch.tensor([0, 3, 4],
                                                                         dtype=torch.int32),
                context_lens=kv.context_lens,
                kv_ranges=torch.tensor([[0, 5], [0, 0], [2, 4], [0, 9]], dtype=torch.int32),
                scale=0.125)
    args.update(over)
    return args, kv


def ranges(*pairs):
    return torch.tensor(pairs, dtype=torch.int32)


BAD_CROSS = [
    # kv_ranges values: outside [0, context_len], lo > hi (naming the token and the bound)
    (dict(kv_ranges=ranges([0, 6], [0, 0], [2, 4], [0, 9])), IndexError,
     r"kv_ranges\[0\] = \(0, 6\) is outside \[0, 5\] \(context_lens\[0\]"),
    (dict(kv_ranges=ranges([0, 5], [0, 0], [2, 4], [0, 10])), IndexError,
     r"kv_ranges\[3\] = \(0, 10\) is outside \[0, 9\] \(context_lens\[1\]"),
    (dict(kv_ranges=ranges([0, 5], [-1, 2], [2, 4], [0, 9])), IndexError,
     r"kv_ranges\[1\] = \(-1, 2\) is outside"),
    (dict(kv_ranges=ranges([0, 5], [0, 0], [4, 2], [0, 9])), ValueError,
     r"kv_ranges\[2\] = \(4, 2\): lo must be <= hi"),
    # kv_ranges shape / dtype / layout
    (dict(kv_ranges=ranges([0, 5], [0, 0], [2, 4])), ValueError,
     r"kv_ranges must be \[num_tokens, 2\] = \[4, 2\]"),
    (dict(kv_ranges=torch.zeros((4, 3), dtype=torch.int32)), ValueError,
     r"kv_ranges must be \[num_tokens, 2\]"),
    (dict(kv_ranges=torch.zeros((4, 2), dtype=torch.int64)), ValueError,
     "kv_ranges must be int32"),
    (dict(kv_ranges=torch.zeros(8, dtype=torch.int32)), ValueError, "kv_ranges"),
    (dict(kv_ranges=torch.zeros((2, 4), dtype=torch.int32).t()), ValueError, "contiguous"),
    # cu_seqlens_q
    (dict(cu_seqlens_q=torch.tensor([0, 4], dtype=torch.int32)), ValueError,
     "cu_seqlens_q has 2 elements, expected 3"),
    (dict(cu_seqlens_q=torch.tensor([1, 3, 4], dtype=torch.int32)), ValueError,
     r"cu_seqlens_q\[0\] must be 0"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32)), ValueError,
     r"cu_seqlens_q\[-1\] must equal the number of query tokens \(4\)"),
    (dict(cu_seqlens_q=torch.tensor([0, 5, 4], dtype=torch.int32)), ValueError,
     "non-decreasing"),
    # lengths and block ids
    (dict(context_lens=torch.tensor([5, 21], dtype=torch.int32)), ValueError,
     r"context_lens\[1\] = 21 is outside"),
    (dict(context_lens=torch.tensor([-1, 9], dtype=torch.int32)), ValueError,
     r"context_lens\[0\] = -1"),
    (dict(block_tables=torch.full((2, 4), 99, dtype=torch.int32)), IndexError,
     "outside the pool"),
    (dict(block_tables=torch.full((2, 4), -1, dtype=torch.int32)), IndexError,
     "outside the pool"),
    # shapes and dtypes of the tensors
    (dict(query=torch.randn((4, 8, 32))), ValueError, "head_dim"),
    (dict(out=torch.zeros((4, 8, 64), dtype=torch.bfloat16)), ValueError, "out is bfloat16"),
    (dict(out=torch.zeros((3, 8, 64))), ValueError, "out has 3 tokens but query has 4"),
    (dict(query=torch.randn((4, 5, 64)), out=torch.zeros((4, 5, 64))), ValueError,
     "multiple of num_kv_heads"),
    (dict(query=torch.randn((4, 8, 64), dtype=torch.float64)), ValueError, "float32"),
    (dict(block_tables=torch.zeros((2, 4), dtype=torch.int64)), ValueError,
     "block_tables must be int32"),
    (dict(scale=float("inf")), ValueError, "scale must be finite"),
    (dict(kv_cache_dtype="int4"), ValueError, "unknown kv_cache_dtype"),
    (dict(k_scale=0.0), ValueError, "k_scale must be finite and > 0"),
]


@pytest.mark.parametrize("over,exc,msg", BAD_CROSS)
def test_cross_rejects(over, exc, msg):
    args, _ = cross_args(**over)
    out = args["out"]
    before = [out.clone(), args["key_cache"].clone(), args["value_cache"].clone()]
    with pytest.raises(exc, match=msg):
        _core.paged_cross_attention(**args)
    after = [out, args["key_cache"], args["value_cache"]]
    for a, b in zip(before, after):  # bit for bit (the caches hold NaN poison)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), "an invalid call wrote memory"


def test_cross_valid_after_rejected_call():
    """A rejected call leaves nothing behind: the same caches then give the reference."""
    args, kv = cross_args(kv_ranges=ranges([0, 5], [0, 0], [9, 2], [0, 9]))
    with pytest.raises(ValueError):
        _core.paged_cross_attention(**args)
    args["kv_ranges"] = ranges([0, 5], [0, 0], [2, 4], [0, 9])
    _core.paged_cross_attention(**args)
    out, q, r = args["out"], args["query"], args["kv_ranges"]
    ref0 = cross_attention_ref(q[0:3], kv.k_full[0], kv.v_full[0], 0.125, r[0:3])
    ref1 = cross_attention_ref(q[3:4], kv.k_full[1], kv.v_full[1], 0.125, r[3:4])
    torch.testing.assert_close(out[0:3].double(), ref0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[3:4].double(), ref1, rtol=1e-5, atol=1e-5)


def test_ops_runs_cpu_tensors_on_the_cpu_kernel():
    """ops.paged_cross_attention picks the backend by the cache's device: CPU tensors here."""
    args, _ = cross_args()
    ops.paged_cross_attention(**args)
    assert not torch.isnan(args["out"]).any()
