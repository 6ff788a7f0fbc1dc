"""Bad input raises a clear error before anything is written; the thread pool's contract."""

from __future__ import annotations

import math
import multiprocessing as mp

import numpy as np
import pytest
import torch

from kernel_reference import attention_ref, make_paged_kv
from pagedllm import _core


def decode_args(**over):
    """Valid decode arguments (2 sequences, 8/2 heads, head_dim 64, block 4), with overrides."""
    gen = torch.Generator().manual_seed(0)
    kv = make_paged_kv(gen, [5, 9], 2, 64, 4, "auto", torch.float32)
    args = dict(out=torch.zeros((2, 8, 64)), query=torch.randn((2, 8, 64), generator=gen),
                key_cache=kv.key_cache, value_cache=kv.value_cache,
                block_tables=kv.block_tables, context_lens=kv.context_lens, scale=0.125)
    args.update(over)
    return args


def prefill_args(**over):
    args = decode_args()
    args["cu_seqlens_q"] = torch.tensor([0, 2, 5], dtype=torch.int32)
    args["out"] = torch.zeros((5, 8, 64))
    args["query"] = torch.randn((5, 8, 64))
    args.update(over)
    return args


def cache_args(**over):
    gen = torch.Generator().manual_seed(1)
    args = dict(key=torch.randn((3, 2, 64), generator=gen), value=torch.randn((3, 2, 64)),
                key_cache=torch.zeros((4, 2, 4, 64)), value_cache=torch.zeros((4, 2, 4, 64)),
                slot_mapping=torch.tensor([0, 5, 15], dtype=torch.int64))
    args.update(over)
    return args


BAD_DECODE = [
    (dict(query=[[1.0]]), ValueError, "torch.Tensor or numpy.ndarray"),
    (dict(query=torch.randn((2, 8, 32))), ValueError, "head_dim"),
    (dict(query=torch.randn((2, 64, 8)).transpose(1, 2)), ValueError, "contiguous in its last"),
    (dict(query=torch.randn((2, 8, 64), dtype=torch.float64)), ValueError, "float32, float16"),
    (dict(out=torch.zeros((2, 8, 64), dtype=torch.bfloat16)), ValueError, "out is bfloat16"),
    (dict(out=torch.zeros((2, 4, 64))), ValueError, "heads"),
    (dict(query=torch.randn((2, 5, 64)), out=torch.zeros((2, 5, 64))), ValueError,
     "multiple of num_kv_heads"),
    (dict(key_cache=torch.zeros((8, 2, 64, 4)).transpose(2, 3)), ValueError, "contiguous"),
    (dict(key_cache=torch.zeros((8, 2, 4, 64), dtype=torch.float16)), ValueError,
     "value_cache"),
    (dict(block_tables=torch.zeros((2, 4), dtype=torch.int64)), ValueError,
     "block_tables must be int32, got int64[2, 4] on cpu"),  # Tensor::describe's numbers
    (dict(block_tables=torch.full((2, 4), 99, dtype=torch.int32)), IndexError, "outside the pool"),
    (dict(block_tables=torch.full((2, 4), -1, dtype=torch.int32)), IndexError, "outside the pool"),
    (dict(context_lens=torch.tensor([5, 17], dtype=torch.int32)), ValueError,
     "max_blocks_per_seq"),
    (dict(context_lens=torch.tensor([-1, 3], dtype=torch.int32)), ValueError, "context_lens[0]"),
    (dict(context_lens=torch.tensor([5], dtype=torch.int32)), ValueError, "elements, expected 2"),
    (dict(scale=float("nan")), ValueError, "scale"),
]


@pytest.mark.parametrize("over,exc,msg", BAD_DECODE)
def test_decode_rejects(over, exc, msg):
    args = decode_args(**over)
    out = args["out"]
    before = out.clone()
    with pytest.raises(exc, match=msg.replace("[", r"\[")):
        _core.paged_attention_decode(**args)
    assert torch.equal(out, before), "an invalid call wrote its output"


@pytest.mark.parametrize("over,msg", [
    (dict(kv_cache_dtype="int4"), "unknown kv_cache_dtype"),
    (dict(kv_cache_dtype="fp8"), "must be uint8"),
    (dict(kv_cache_dtype="bf16"), "must be bfloat16"),
    (dict(k_scale=0.0), "k_scale"),
    (dict(v_scale=float("inf")), "v_scale"),
])
def test_cache_dtype_and_scales_rejected(over, msg):
    with pytest.raises(ValueError, match=msg):
        _core.paged_attention_decode(**decode_args(**over))


def test_unsupported_sizes_rejected():
    for shape, msg in [((8, 2, 4, 12), "multiple of 8"), ((2, 2, 512, 64), "block_size"),
                       ((8, 2, 4, 1024), "head_dim")]:
        kc = torch.zeros(shape)
        d = shape[3]
        with pytest.raises(ValueError, match=msg):
            _core.paged_attention_decode(torch.zeros((1, 2, d)), torch.zeros((1, 2, d)), kc, kc,
                                         torch.zeros((1, 1), dtype=torch.int32),
                                         torch.ones(1, dtype=torch.int32), 1.0)


@pytest.mark.parametrize("cu,msg", [
    ([1, 2, 5], "cu_seqlens_q\\[0\\]"), ([0, 2, 4], "cu_seqlens_q\\[-1\\]"),
    ([0, 6, 5], "more query tokens|non-decreasing|context of only"),
    ([0, 2], "elements, expected 3"),
])
def test_prefill_rejects_bad_cu_seqlens(cu, msg):
    args = prefill_args(cu_seqlens_q=torch.tensor(cu, dtype=torch.int32))
    with pytest.raises(ValueError, match=msg):
        _core.paged_attention_prefill(**args)


def test_prefill_rejects_q_len_beyond_context():
    args = prefill_args(context_lens=torch.tensor([1, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match="context of only 1"):
        _core.paged_attention_prefill(**args)


def test_reshape_and_cache_rejects_and_writes_nothing():
    args = cache_args(slot_mapping=torch.tensor([0, 5, 16], dtype=torch.int64))
    with pytest.raises(IndexError, match="slot_mapping\\[2\\] = 16"):
        _core.reshape_and_cache(**args)
    assert not args["key_cache"].any() and not args["value_cache"].any()
    for over, msg in [(dict(slot_mapping=torch.tensor([0, 1], dtype=torch.int64)), "entries"),
                      (dict(slot_mapping=torch.tensor([0, 1, 2.0])), "int32 or int64"),
                      (dict(value=torch.randn((3, 2, 64), dtype=torch.bfloat16)), "value is"),
                      (dict(key=torch.randn((3, 4, 64))), "heads")]:
        with pytest.raises(ValueError, match=msg):
            _core.reshape_and_cache(**cache_args(**over))


def test_read_only_output_rejected():
    kc = np.zeros((2, 1, 4, 8), dtype=np.float32)
    ro = np.zeros((2, 1, 4, 8), dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _core.reshape_and_cache(np.zeros((1, 1, 8), np.float32), np.zeros((1, 1, 8), np.float32),
                                ro, kc, np.array([0]))


def test_block_mapping_rejected():
    pool = torch.zeros((4, 8))
    with pytest.raises(IndexError, match="outside"):
        _core.copy_blocks([pool], torch.tensor([[0, 4]], dtype=torch.int32))
    with pytest.raises(ValueError, match="appears twice"):
        _core.copy_blocks([pool], torch.tensor([[0, 2], [1, 2]], dtype=torch.int32))
    with pytest.raises(ValueError, match="both a source and a destination"):
        _core.copy_blocks([pool], torch.tensor([[0, 1], [1, 2]], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_mapping must have 2 dimensions"):
        _core.copy_blocks([pool], torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="bytes"):
        _core.swap_blocks(pool, torch.zeros((4, 4)), torch.tensor([[0, 0]], dtype=torch.int32))


def test_block_pools_with_overlapping_blocks_rejected():
    """Blocks closer than their size (an as_strided view) would make copy_blocks an overlapping
    memcpy; refused before anything is copied."""
    base = torch.arange(16, dtype=torch.float32)
    pool = base.as_strided((8, 4), (1, 1))
    with pytest.raises(ValueError, match="caches: its 8 blocks overlap: the block stride is 4 "
                                         "bytes but a block holds 16 bytes"):
        _core.copy_blocks([pool], torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="src: its 8 blocks overlap"):
        _core.swap_blocks(pool, torch.zeros(8, 4), torch.tensor([[0, 1]]))
    assert torch.equal(base, torch.arange(16, dtype=torch.float32))


def test_linear_output_sharing_an_input_rejected():
    w = torch.randn(5, 7)
    packed = torch.zeros(_core.packed_linear_elements("float32", 5, 7))
    _core.pack_linear_weight(packed, w)
    before = packed.clone()
    with pytest.raises(ValueError, match=r"linear: y \(40 bytes at 0x[0-9a-f]+\) overlaps packed"):
        _core.linear(packed[:10].view(2, 5), torch.randn(2, 7), packed, None)
    assert torch.equal(packed, before)
    bias = torch.zeros(5)
    with pytest.raises(ValueError, match="overlaps bias"):
        _core.linear(bias.view(1, 5), torch.randn(1, 7), packed, bias)
    with pytest.raises(ValueError, match="pack_linear_weight: packed .* overlaps weight"):
        _core.pack_linear_weight(packed, packed[:35].view(5, 7))


def test_numpy_inputs_work():
    gen = torch.Generator().manual_seed(2)
    kv = make_paged_kv(gen, [7], 2, 64, 4, "auto", torch.float32)
    q = np.random.default_rng(0).standard_normal((1, 4, 64), dtype=np.float32)
    out = np.full_like(q, np.nan)
    _core.paged_attention_decode(out, q, kv.key_cache.numpy(), kv.value_cache.numpy(),
                                 kv.block_tables.numpy(), kv.context_lens.numpy(), 0.125)
    ref = attention_ref(torch.from_numpy(q), kv.k_full[0], kv.v_full[0], 0.125,
                        torch.tensor([6]))
    assert np.allclose(out, ref.numpy(), atol=1e-5)


def test_thread_count_setting():
    old = _core.get_num_threads()
    try:
        _core.set_num_threads(3)
        assert _core.get_num_threads() == 3
        with pytest.raises(ValueError, match="num_threads"):
            _core.set_num_threads(0)
    finally:
        _core.set_num_threads(old)


def _decode_in_child(queue):
    args = decode_args()
    _core.paged_attention_decode(**args)
    queue.put(args["out"].numpy().copy())


def test_kernels_work_in_forked_child():
    """The pool was running in the parent; a forked child must build its own, not hang."""
    args = decode_args()
    _core.paged_attention_decode(**args)  # the parent's pool is up
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_decode_in_child, args=(queue,))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert np.allclose(got, args["out"].numpy(), atol=1e-6)


def test_concurrent_python_threads():
    """Calls from several Python threads (GIL released) give the same results as serial ones."""
    import threading

    runs = [decode_args() for _ in range(6)]
    expected = []
    for a in runs:
        b = dict(a, out=torch.zeros_like(a["out"]))
        _core.paged_attention_decode(**b)
        expected.append(b["out"])
    threads = [threading.Thread(target=lambda a=a: [_core.paged_attention_decode(**a)
                                                    for _ in range(20)]) for a in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, e in zip(runs, expected):
        assert torch.equal(a["out"], e)
    assert math.isfinite(float(runs[0]["out"].sum()))
