"""huge_pages.zeros: the KV pool's memory on 2 MiB transparent huge pages (Linux)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from pagedllm.model import huge_pages
from pagedllm.model.checkpoint import random_config
from pagedllm.model.kv_cache import PagedKVCache

BIG = (huge_pages.MIN_HUGE_BYTES // 4 + 3,)  # float32 elements: just over the threshold


def _mapping(addr: int):
    """The /proc/self/smaps fields of the mapping that holds `addr` (None: no mapping does)."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        pytest.skip("no /proc/self/smaps")
    fields = None
    for line in lines:
        head = line.split()[0]
        if "-" in head and ":" not in head:
            if fields is not None:
                return fields
            lo, hi = (int(x, 16) for x in head.split("-"))
            if lo <= addr < hi:
                fields = {}
        elif fields is not None:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return fields


def _vm_flags(addr: int):
    """The VmFlags of the mapping of this process that holds `addr` (None: no mapping does)."""
    fields = _mapping(addr)
    return None if fields is None else set(fields["VmFlags"])


needs_thp = pytest.mark.skipif(not huge_pages.available(),
                               reason=f"transparent huge pages unavailable "
                                      f"(mode {huge_pages.thp_mode()})")


@pytest.fixture(autouse=True)
def _opted_in(monkeypatch):
    """Every test runs with the opt-in set, unless it unsets it."""
    monkeypatch.setenv(huge_pages.ENV, "1")


@needs_thp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_large_tensor_is_zero_aligned_and_advised(dtype):
    shape = (5, huge_pages.MIN_HUGE_BYTES // 5 + 7)
    t = huge_pages.zeros(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert "hg" in _vm_flags(t.data_ptr())  # madvise(MADV_HUGEPAGE) took
    nbytes = t.numel() * t.element_size()
    assert int(_mapping(t.data_ptr())["Rss"][0]) * 1024 >= nbytes  # faulted in up front
    assert not t.any()
    t[-1, -1] = 3
    t[0, 0] = 1
    assert int(t.sum()) == 4  # writable, end to end, nothing past the shape


def test_small_or_non_cpu_or_disabled_are_plain_zeros(monkeypatch):
    small = huge_pages.zeros((1024,), torch.float32)
    assert small.untyped_storage().nbytes() == 4096 and not small.any()
    meta = huge_pages.zeros(BIG, torch.float32, device="meta")
    assert meta.device.type == "meta"
    for off in ("0", None):  # opted out, and the default
        if off is None:
            monkeypatch.delenv(huge_pages.ENV)
        else:
            monkeypatch.setenv(huge_pages.ENV, off)
        assert not huge_pages.enabled()
        plain = huge_pages.zeros(BIG, torch.float32)
        assert plain.untyped_storage().nbytes() == BIG[0] * 4 and not plain.any()


def test_thp_mode_reads_the_system_setting(tmp_path, monkeypatch):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "_THP_SETTING", f)
    assert huge_pages.thp_mode() == "madvise"
    f.write_text("always madvise [never]\n")
    assert huge_pages.thp_mode() == "never" and not huge_pages.available()
    assert not huge_pages.enabled()  # opted in, but the system says never
    monkeypatch.setattr(huge_pages, "_THP_SETTING", tmp_path / "missing")
    assert huge_pages.thp_mode() == "absent" and not huge_pages.enabled()


@needs_thp
def test_views_keep_the_mapping_and_the_last_one_frees_it():
    t = huge_pages.zeros(BIG, torch.float32)
    t.fill_(2.0)
    addr = t.data_ptr()
    view = t[100:200]
    del t
    gc.collect()
    assert float(view.sum()) == 200.0  # still mapped through the view
    assert _vm_flags(addr) is not None
    del view
    gc.collect()
    flags = _vm_flags(addr)
    assert flags is None or "hg" not in flags  # unmapped (the range may be reused since)


@needs_thp
def test_the_kv_pool_is_on_huge_pages_and_works():
    cfg = random_config("tiny")
    blocks = 2 * huge_pages.MIN_HUGE_BYTES // PagedKVCache.bytes_per_block(cfg, 16)
    kv = PagedKVCache(cfg, blocks, 16)
    assert kv.pool.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert "hg" in _vm_flags(kv.pool.data_ptr())
    assert not kv.pool.any()
    k, v = kv.key_cache(1), kv.value_cache(1)
    k[blocks - 1].fill_(1.0)
    v[0].fill_(2.0)
    assert float(kv.pool[blocks - 1, 1, 0].sum()) == k[0].numel()
    assert float(kv.pool[0, 1, 1].sum()) == 2.0 * v[0].numel()
