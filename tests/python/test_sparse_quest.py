"""Quest: the per-block key bounds kept beside the pool (against min/max of the written keys,
every storage dtype, copied with the block), and the per-KV-head top-k choice against a plain
Python computation of the upper bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_engines import ENGINES, restore, use_engine
from pagedllm import ops
from pagedllm.model import PagedKVCache
from pagedllm.model.config import ModelConfig
from pagedllm.sparse.fp8 import as_float
from pagedllm.sparse.key_bounds import update_key_bounds
from pagedllm.sparse.plan import SparsePlan
from pagedllm.sparse.quest_select import _torch_indices, quest_lists

CFG = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
           intermediate_size=64, vocab_size=32, max_position_embeddings=4096)


def _config():
    return ModelConfig.from_dict(dict(CFG, model_type="llama", rms_norm_eps=1e-5))


@pytest.mark.parametrize("kv_dtype", ["auto", "bf16", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("block_size", [1, 2, 16])
def test_bounds_track_written_keys(kv_dtype, block_size):
    cfg = _config()
    kv = PagedKVCache(cfg, 12, block_size, kv_dtype, k_scale=0.5, v_scale=0.5, key_bounds=True)
    gen = torch.Generator().manual_seed(block_size)
    blocks = [7, 3, 9]  # one sequence's table
    written = 0
    for n_new in [block_size + 3, 1, 1, 2]:
        n_new = min(n_new, len(blocks) * block_size - written)
        pos = torch.arange(written, written + n_new)
        slots = torch.tensor(blocks)[pos // block_size] * block_size + pos % block_size
        for layer in range(cfg.num_hidden_layers):
            k = torch.randn((n_new, 2, cfg.head_dim), generator=gen)
            ops.reshape_and_cache(k, k, kv.key_cache(layer), kv.value_cache(layer), slots,
                                  kv.kernel_kv_dtype, kv.k_scale, kv.v_scale)
            lo, hi = kv.key_bounds(layer)
            update_key_bounds(kv.key_cache(layer), lo, hi, slots, kv.kernel_kv_dtype)
        written += n_new
        for layer in range(cfg.num_hidden_layers):
            keys = as_float(kv.key_cache(layer), kv.kernel_kv_dtype)  # stored values
            lo, hi = (as_float(t, kv.kernel_kv_dtype) for t in kv.key_bounds(layer))
            for i, b in enumerate(blocks):
                filled = min(block_size, max(0, written - i * block_size))
                if filled == 0:
                    continue
                rows = keys[b, :, :filled]  # [kvh, filled, head_dim]
                assert torch.equal(lo[b], rows.amin(dim=1)) and torch.equal(hi[b], rows.amax(dim=1))
    # the bounds live in the block's pool region: a block copy carries them
    kv.copy_blocks(torch.tensor([[7, 0]], dtype=torch.int32))
    for layer in range(cfg.num_hidden_layers):
        lo, hi = kv.key_bounds(layer)
        assert torch.equal(lo[0], lo[7]) and torch.equal(hi[0], hi[7])


def test_bounds_pool_size():
    cfg = _config()
    plain = PagedKVCache.bytes_per_block(cfg, 2, "auto")
    assert PagedKVCache.bytes_per_block(cfg, 2, "auto", key_bounds=True) == plain * 5 // 3
    assert PagedKVCache(cfg, 4, 2, key_bounds=True).nbytes == 4 * plain * 5 // 3


def ref_quest(q, lo, hi, table, n_blocks, forced, budget, kvh):
    """Plain loops: per KV head, the forced blocks then the best upper bounds."""
    heads, hd = q.shape
    g = heads // kvh
    out = []
    for h in range(kvh):
        ub = {}
        for b in range(n_blocks):
            phys = table[b]
            ub[b] = max(sum(max(q[hh, d] * lo[phys, h, d], q[hh, d] * hi[phys, h, d])
                            for d in range(hd)) for hh in range(h * g, (h + 1) * g))
        rest = sorted((b for b in range(n_blocks) if b not in forced), key=lambda b: -ub[b])
        out.append(sorted(list(forced) + rest[:budget - len(forced)]))
    return out


@pytest.fixture(params=ENGINES + ["torch"])
def path(request):
    """The C++ kernel on each CPU engine (those this machine lacks are skipped), then torch."""
    if request.param != "torch":
        use_engine(request.param)
    yield request.param
    restore()


@pytest.mark.parametrize("storage", ["auto", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_quest_choice_matches_reference(path, storage):
    gen = torch.Generator().manual_seed(0)
    kvh, heads, hd, pool = 2, 4, 8, 40
    lo = torch.randn((pool, kvh, hd), generator=gen, dtype=torch.float64).float()
    hi = lo + torch.rand((pool, kvh, hd), generator=gen)
    if storage == "bf16":  # bounds stored in the cache's type, read exactly
        lo, hi = lo.bfloat16(), hi.bfloat16()
    elif storage.startswith("fp8"):
        f8 = torch.float8_e4m3fn if storage == "fp8_e4m3" else torch.float8_e5m2
        lo, hi = lo.to(f8).view(torch.uint8), hi.to(f8).view(torch.uint8)
    lo_ref, hi_ref = as_float(lo, storage).double(), as_float(hi, storage).double()
    q = torch.randn((3, heads, hd), generator=gen)
    tables = torch.stack([torch.randperm(pool, generator=gen)[:20] for _ in range(3)]).int()
    nb = np.array([20, 4, 13], dtype=np.int32)
    static = [[0, 18, 19], [0, 1, 2, 3], [0, 12]]
    budgets = np.array([6, 0, 5], dtype=np.int32)
    indptr = np.zeros(4, dtype=np.int32)
    np.cumsum([len(s) for s in static], out=indptr[1:])
    plan = SparsePlan(indptr, np.concatenate(static).astype(np.int32), budgets, nb, 0, 0)
    if path != "torch":
        ip, ix = quest_lists(q, lo, hi, tables, plan, storage)
    else:
        ip, ix = quest_lists(q, lo, hi, tables, plan, storage)[0], _torch_indices(
            q, lo, hi, tables, plan, storage)
    got = [ix[ip[i]:ip[i + 1]].tolist() for i in range(3 * kvh)]
    want = []
    for s in range(3):
        if budgets[s]:
            want += ref_quest(q[s].double(), lo_ref, hi_ref, tables[s].tolist(),
                              int(nb[s]), set(static[s]), int(budgets[s]), kvh)
        else:
            want += [static[s]] * kvh
    assert got == want


def test_quest_kernel_rejects_bad_sizes():
    from pagedllm import _core

    lo = torch.zeros((10, 2, 8))
    q = torch.zeros((1, 4, 8))
    tables = torch.arange(10, dtype=torch.int32)[None]
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    out = torch.empty(6, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"budget\[0\] = 11 must be 0 or in \[1, 10\]"):
        _core.quest_select(q, lo, lo, tables, i32([10]), i32([11]), i32([0, 1]), i32([0]),
                           i32([0, 3, 6]), out)
    with pytest.raises(ValueError, match=r"out list 0 has room for 3 ids, expected 4"):
        _core.quest_select(q, lo, lo, tables, i32([10]), i32([4]), i32([0, 1]), i32([0]),
                           i32([0, 3, 6]), out)
    with pytest.raises(IndexError, match=r"forced_indices\[0\] = 12 must increase inside"):
        _core.quest_select(q, lo, lo, tables, i32([10]), i32([3]), i32([0, 1]), i32([12]),
                           i32([0, 3, 6]), out)
