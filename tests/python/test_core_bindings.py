"""The _core bindings: argument conversion, result types, error mapping, build info."""

import numpy as np
import pytest

from pagedllm import _core


def test_build_info_reports_build_and_machine():
    info = _core.build_info()
    assert info["version"] == _core.__version__
    assert isinstance(info["cuda_compiled"], bool)
    assert "generic" in info["cpu_kernels_compiled"]
    assert info["gpu_count"] == len(info["gpu_names"]) >= 0
    assert isinstance(info["cpu_features"], list)


def test_append_returns_int64_slots_and_cow_pairs():
    m = _core.KVCacheManager(num_blocks=8, block_size=4)
    assert m.allocate(1, [5, 6, 7]) == 0
    slots, cow = m.append(1, np.array([5, 6, 7], dtype=np.int64))  # any int dtype converts
    assert slots.dtype == np.int64 and slots.tolist() == [0, 1, 2]
    assert cow.dtype == np.int32 and cow.shape == (0, 2)
    m.fork(1, 2)
    slots, cow = m.append(2, [8])
    assert cow.tolist() == [[0, 1]]
    assert slots.tolist() == [4 + 3]
    tables = m.block_tables([1, 2])
    assert tables.dtype == np.int32 and tables.tolist() == [[0], [1]]
    assert m.block_tables([1], width=3).tolist() == [[0, 0, 0]]


def test_append_batch_checks_lengths():
    m = _core.KVCacheManager(8, 4)
    m.allocate(1, [1])
    m.allocate(2, [1])
    slots, _ = m.append_batch([1, 2], [1, 2], [1, 2, 3])
    assert slots.tolist() == [0, 4, 5]
    with pytest.raises(ValueError, match="expected sum\\(counts\\) = 3"):
        m.append_batch([1, 2], [1, 2], [1, 2])
    with pytest.raises(ValueError, match="one per sequence"):
        m.append_batch([1, 2], [1], [1])
    with pytest.raises(ValueError, match="appears more than once"):
        m.append_batch([1, 1], [1, 1], [1, 2])
    with pytest.raises(ValueError, match="one-dimensional"):
        m.append(1, [[1, 2]])


def test_out_of_blocks_is_none_not_an_error():
    m = _core.KVCacheManager(2, 2, enable_prefix_caching=False)
    m.allocate(1, [1])
    assert m.append(1, list(range(5))) is None
    assert m.num_tokens(1) == 0
    assert m.append_batch([1], [5], list(range(5))) is None
    a = _core.BlockAllocator(2)
    assert a.allocate_n(3) is None
    assert a.allocate_n(2) == [0, 1]
    assert a.allocate() is None


def test_errors_map_to_python_exceptions():
    m = _core.KVCacheManager(4, 4)
    m.allocate(1, [1, 2])
    with pytest.raises(IndexError, match="unknown sequence id 7"):
        m.free(7)
    with pytest.raises(RuntimeError, match="already allocated"):
        m.allocate(1, [1])
    with pytest.raises(ValueError, match="at least 1 token"):
        m.allocate(3, [])
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        _core.KVCacheManager(4, 0)
    a = _core.BlockAllocator(2)
    b = a.allocate()
    a.decref(b)
    with pytest.raises(RuntimeError, match="double free"):
        a.decref(b)
    with pytest.raises(IndexError, match="outside the pool"):
        a.incref(5)
    with pytest.raises(IndexError, match="outside the pool"):
        m.is_cached(4)


def test_stats_dict_fields():
    m = _core.KVCacheManager(8, 4)
    m.allocate(1, list(range(6)))
    m.append(1, list(range(6)))
    s = m.stats()
    for key in ("num_blocks", "block_size", "used_blocks", "cached_blocks", "free_blocks",
                "peak_used_blocks", "tokens_stored", "slots_reserved", "slots_empty",
                "utilization", "prefix_cache_queries", "prefix_cache_hits", "evictions",
                "cow_copies", "num_seqs", "cached_entries"):
        assert key in s
    assert s["utilization"] == pytest.approx(6 / 8)
    m.free(1)
    assert m.stats()["peak_used_blocks"] == 2
    m.reset_peak()
    assert m.stats()["peak_used_blocks"] == 0
    assert m.lru_front() == 0 and m.is_parked(0)
