"""paged_attention_{decode,prefill}_sparse against a float64 reference masking the same blocks,
on every CPU engine; the all-blocks case against the dense kernels (bit for bit); bad CSR lists.

Cases cover every storage type, GQA and MQA, block sizes 1..256, per-sequence and per-KV-head
lists, empty lists, split-K decode (a long single sequence) and chunked-prefill rows.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from cpu_engines import ENGINES, restore, use_engine
from kernel_reference import make_paged_kv, random_lens
from sparse_kernel_reference import flatten_lists, random_lists, sparse_attention_ref, to_csr
from test_kernels_attention import assert_close
from pagedllm import _core

KV_DTYPES = ["auto", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
GROUPS = [(8, 8), (8, 2), (6, 1)]  # (num_heads, num_kv_heads): MHA, GQA, MQA
BLOCK_SIZES = [1, 3, 16, 64, 256]


@pytest.fixture(params=ENGINES)
def kernel(request):
    """Runs the test once per CPU engine (those this machine lacks are skipped)."""
    use_engine(request.param)
    yield request.param
    restore()


def _scales(kv_dtype):
    return (0.45, 1.6) if kv_dtype.startswith("fp8") else (1.0, 1.0)


def run_sparse_decode(gen, rng, lens, heads, kvh, head_dim, block_size, kv_dtype, act,
                      per_head, lists=None):
    ks, vs = _scales(kv_dtype)
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, ks, vs)
    lists = lists or random_lists(rng, lens, kvh, block_size, per_head)
    indptr, indices = to_csr(flatten_lists(lists, per_head))
    n = len(lens)
    q = torch.randn((n, heads, head_dim), generator=gen).to(act)
    out = torch.full((n, heads, head_dim), float("nan"), dtype=act)
    scale = 1.0 / math.sqrt(head_dim)
    _core.paged_attention_decode_sparse(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                        kv.context_lens, indptr, indices, scale, kv_dtype, ks, vs)
    for s, length in enumerate(lens):
        ref = sparse_attention_ref(q[s:s + 1], kv.k_full[s], kv.v_full[s], scale,
                                   torch.tensor([length - 1]), lists[s], block_size)
        assert_close(out[s:s + 1], ref)


def run_sparse_prefill(gen, rng, lens, q_lens, heads, kvh, head_dim, block_size, kv_dtype, act,
                       per_head):
    ks, vs = _scales(kv_dtype)
    kv = make_paged_kv(gen, lens, kvh, head_dim, block_size, kv_dtype, act, ks, vs)
    lists = random_lists(rng, lens, kvh, block_size, per_head)
    indptr, indices = to_csr(flatten_lists(lists, per_head))
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    total = int(cu[-1])
    q = torch.randn((total, heads, head_dim), generator=gen).to(act)
    out = torch.full((total, heads, head_dim), float("nan"), dtype=act)
    scale = 1.0 / math.sqrt(head_dim)
    _core.paged_attention_prefill_sparse(out, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                         cu, kv.context_lens, indptr, indices, scale, kv_dtype,
                                         ks, vs)
    for s, (length, q_len) in enumerate(zip(lens, q_lens)):
        a, b = int(cu[s]), int(cu[s + 1])
        if a == b:
            continue
        pos = torch.arange(length - q_len, length)
        ref = sparse_attention_ref(q[a:b], kv.k_full[s], kv.v_full[s], scale, pos, lists[s],
                                   block_size)
        assert_close(out[a:b], ref)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("heads,kvh", GROUPS)
@pytest.mark.parametrize("per_head", [False, True])
def test_decode_sparse_matches_masked_reference(kernel, kv_dtype, heads, kvh, per_head):
    rng = random.Random(hash((kv_dtype, heads, kvh, per_head)) % 1000)
    gen = torch.Generator().manual_seed(rng.randrange(1000))
    for block_size in BLOCK_SIZES:
        lens = random_lens(rng, block_size, 3)
        act = rng.choice([torch.float32, torch.bfloat16])
        run_sparse_decode(gen, rng, lens, heads, kvh, rng.choice([64, 128]), block_size,
                          kv_dtype, act, per_head)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("heads,kvh", GROUPS)
def test_prefill_sparse_matches_masked_reference(kernel, kv_dtype, heads, kvh):
    rng = random.Random(hash((kv_dtype, heads, kvh)) % 1000 + 7)
    gen = torch.Generator().manual_seed(rng.randrange(1000))
    for block_size in BLOCK_SIZES:
        lens = random_lens(rng, block_size, 3)
        # whole prompts, chunks, a few new tokens after a cached prefix, one token.
        q_lens = [min(120, rng.choice([n, max(1, n // 2), min(n, 9), 1])) for n in lens]
        run_sparse_prefill(gen, rng, lens, q_lens, heads, kvh, 64, block_size, kv_dtype,
                           torch.float32, per_head=rng.random() < 0.5)


def test_decode_sparse_long_context_split_k(kernel):
    """One long sequence: the (compacted) context is split across threads and merged."""
    rng = random.Random(3)
    gen = torch.Generator().manual_seed(3)
    for per_head in (False, True):
        run_sparse_decode(gen, rng, [6000], 8, 2, 128, 16, "bf16", torch.float32, per_head)


def test_empty_list_gives_zeros(kernel):
    gen = torch.Generator().manual_seed(4)
    lists = [[[0, 2]], [[]], [[1]]]
    run_sparse_decode(gen, random.Random(4), [40, 20, 33], 2, 1, 64, 16, "auto", torch.float32,
                      per_head=False, lists=lists)


def _all_blocks(kv, block_size, lists_per_seq=1):
    lists = []
    for n in kv.context_lens.tolist():
        lists += [list(range((n + block_size - 1) // block_size))] * lists_per_seq
    return to_csr(lists)


@pytest.mark.parametrize("kv_dtype", ["auto", "bf16", "fp8_e4m3"])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_all_blocks_equals_dense_bit_for_bit(kernel, kv_dtype, block_size):
    gen = torch.Generator().manual_seed(block_size)
    lens = [1, block_size, block_size + 1, 700, 3000]
    heads, kvh, hd = 8, 2, 128
    ks, vs = _scales(kv_dtype)
    kv = make_paged_kv(gen, lens, kvh, hd, block_size, kv_dtype, torch.float32, ks, vs)
    scale = hd ** -0.5
    q = torch.randn((len(lens), heads, hd), generator=gen)
    dense = torch.empty_like(q)
    _core.paged_attention_decode(dense, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, scale, kv_dtype, ks, vs)
    for per_head in (1, kvh):
        indptr, indices = _all_blocks(kv, block_size, per_head)
        sparse = torch.empty_like(q)
        _core.paged_attention_decode_sparse(sparse, q, kv.key_cache, kv.value_cache,
                                            kv.block_tables, kv.context_lens, indptr, indices,
                                            scale, kv_dtype, ks, vs)
        assert torch.equal(sparse, dense)
    q_lens = [1, block_size, 1, 300, 50]
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    qp = torch.randn((int(cu[-1]), heads, hd), generator=gen)
    dense_p, sparse_p = torch.empty_like(qp), torch.empty_like(qp)
    _core.paged_attention_prefill(dense_p, qp, kv.key_cache, kv.value_cache, kv.block_tables, cu,
                                  kv.context_lens, scale, kv_dtype, ks, vs)
    indptr, indices = _all_blocks(kv, block_size)
    _core.paged_attention_prefill_sparse(sparse_p, qp, kv.key_cache, kv.value_cache,
                                         kv.block_tables, cu, kv.context_lens, indptr, indices,
                                         scale, kv_dtype, ks, vs)
    assert torch.equal(sparse_p, dense_p)


class TestBadLists:
    """Bad CSR lists raise a clear error before anything is written."""

    def setup_method(self):
        gen = torch.Generator().manual_seed(5)
        self.kv = make_paged_kv(gen, [40, 17], 2, 64, 16, "auto", torch.float32)  # 3 and 2 blocks
        self.q = torch.randn((2, 4, 64), generator=gen)
        self.out = torch.full_like(self.q, float("nan"))

    def call(self, indptr, indices):
        kv = self.kv
        _core.paged_attention_decode_sparse(
            self.out, self.q, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens,
            torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
            0.125)

    @pytest.mark.parametrize("indptr,indices,match", [
        ([0, 2, 3], [0, 3, 1], r"indices\[1\] = 3 .* outside the sequence's blocks \[0, 3\)"),
        ([0, 2, 3], [0, 1, 2], r"indices\[2\] = 2 .* outside the sequence's blocks \[0, 2\)"),
        ([0, 2, 3], [0, -1, 1], r"indices\[1\] = -1"),
        ([0, 2, 3], [2, 1, 0], r"strictly increasing: 2 then 1"),
        ([0, 2, 3], [1, 1, 0], r"strictly increasing: 1 then 1"),
        ([0, 3], [0, 1, 2], r"indptr has 2 entries: expected num_seqs \+ 1 = 3 .* or num_seqs "
                            r"\* num_kv_heads \+ 1 = 5"),
        ([1, 2, 3], [0, 1, 0], r"indptr\[0\] must be 0, got 1"),
        ([0, 2, 1], [0, 1, 0], r"non-decreasing"),
        ([0, 1, 2], [0, 1, 0], r"indptr\[-1\] = 2 must equal the number of indices \(3\)"),
    ])
    def test_bad_lists(self, indptr, indices, match):
        with pytest.raises((ValueError, IndexError), match=match):
            self.call(indptr, indices)
        assert torch.isnan(self.out).all(), "an output was written before the error"

    def test_wrong_dtype(self):
        kv = self.kv
        with pytest.raises(ValueError, match="sparse_indices must be int32"):
            _core.paged_attention_decode_sparse(
                self.out, self.q, kv.key_cache, kv.value_cache, kv.block_tables,
                kv.context_lens, torch.tensor([0, 1, 2], dtype=torch.int32),
                torch.tensor([0, 0], dtype=torch.int64), 0.125)


def test_unlisted_table_entries_are_never_read(kernel):
    """A dropped block's entry (-1, streaming) is fine while unlisted; listed, it is an error."""
    gen = torch.Generator().manual_seed(6)
    kv = make_paged_kv(gen, [100], 2, 64, 16, "auto", torch.float32)  # 7 blocks
    q = torch.randn((1, 4, 64), generator=gen)
    keep = [0, 4, 5, 6]
    tables = kv.block_tables.clone()
    tables[0, 1:4] = -1
    ip, ix = to_csr([keep])
    out, want = torch.empty_like(q), torch.empty_like(q)
    _core.paged_attention_decode_sparse(want, q, kv.key_cache, kv.value_cache, kv.block_tables,
                                        kv.context_lens, ip, ix, 0.125)
    _core.paged_attention_decode_sparse(out, q, kv.key_cache, kv.value_cache, tables,
                                        kv.context_lens, ip, ix, 0.125)
    assert torch.equal(out, want)
    ip, ix = to_csr([[0, 1, 6]])
    with pytest.raises(IndexError, match=r"block_tables\[0\]\[1\] = -1 \(listed at sparse "
                                         r"indices\[1\]\) is outside the pool"):
        _core.paged_attention_decode_sparse(out, q, kv.key_cache, kv.value_cache, tables,
                                            kv.context_lens, ip, ix, 0.125)
