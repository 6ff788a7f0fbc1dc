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


# --- integer arguments: refused, never truncated ---------------------------------------------

def test_token_ids_are_never_truncated():
    """A float is not rounded to an id and an id outside int32 does not wrap: int64 ids 2^32 + 5
    and 2^33 used to become 5 and 0 and hit the prefix cache of a prompt that held them."""
    m = _core.KVCacheManager(8, 2)
    with pytest.raises(ValueError, match=r"prompt must hold integers \(int32\), got dtype float64"):
        m.allocate(1, [1.9, 2.2, 3.0])
    with pytest.raises(ValueError, match="got dtype float32"):
        m.allocate(1, np.array([1, 2], np.float32))
    with pytest.raises(ValueError, match="got dtype bool"):
        m.allocate(1, [True, False])
    m.allocate(1, [5, 0, 7])
    m.append(1, [5, 0, 7])
    m.free(1)
    assert m.num_cached_tokens([5, 0, 9]) == 2  # the cached block [5, 0]
    wide = np.array([2**32 + 5, 2**33, 9], np.int64)
    with pytest.raises(ValueError, match=r"prompt\[0\] = 4294967301 is outside int32 "
                                         r"\[-2147483648, 2147483647\]"):
        m.num_cached_tokens(wide)
    with pytest.raises(ValueError, match=r"tokens\[0\] = 8589934592 is outside int32"):
        m.block_hashes(wide[1:])
    with pytest.raises(ValueError, match=r"prompt\[0\] = 1180591620717411303424 is outside int32"):
        m.allocate(2, [2**70])
    with pytest.raises(ValueError, match=r"prompt\[0\] = 2147483648 is outside int32"):
        m.allocate(2, np.array([2**31], np.uint64))
    assert 2 not in m and m.stats()["num_seqs"] == 0
    m.allocate(2, [1])
    with pytest.raises(ValueError, match=r"tokens\[1\] = -2147483649 is outside int32"):
        m.append(2, [1, -2**31 - 1])
    with pytest.raises(ValueError, match=r"tokens\[0\] = 4294967296 is outside int32"):
        m.append_batch([2], [1], [2**32])
    with pytest.raises(ValueError, match=r"counts must hold integers"):
        m.append_batch([2], [1.0], [3])
    with pytest.raises(ValueError, match=r"seq_ids\[0\] = 9223372036854775808 is outside int64"):
        m.append_batch([2**63], [1], [3])
    with pytest.raises(ValueError, match=r"hashes\[0\] = -1 is outside uint64"):
        m.query_admission([1, 2, 3], [-1], 0, 2, 1)
    assert m.num_tokens(2) == 0


def test_integer_arrays_of_any_int_dtype_and_layout_convert():
    m = _core.KVCacheManager(8, 2)
    m.allocate(1, np.array([-2**31, 2**31 - 1], np.int64))  # int32's whole range
    slots, _ = m.append(1, np.array([3, 4], ">i4"))  # byte-swapped
    assert slots.tolist() == [0, 1]
    assert m.append(1, np.arange(10, dtype=np.int32)[::5])[0].tolist() == [2, 3]  # strided
    assert m.append(1, np.array([7], np.uint8))[0].tolist() == [4]
    assert m.append(1, np.array([7, 8], dtype=object))[0].tolist() == [5, 6]
    assert m.append(1, (9,))[0].tolist() == [7]
    h = m.block_hashes([1, 2, 3, 4])
    assert h.dtype == np.uint64
    assert m.query_admission([1, 2, 3, 4], [int(x) for x in h], 0, 4, 1) == \
        m.query_admission([1, 2, 3, 4], h, 0, 4, 1)
    assert m.block_tables(np.array([1], np.uint8)).tolist() == [[0, 1, 2, 3]]


def test_block_key_refuses_ids_outside_int32():
    """block_key(ROOT, [2^32 + 5]) was block_key(ROOT, [5])."""
    root = _core.ROOT_BLOCK_KEY
    with pytest.raises(ValueError, match=r"tokens\[0\] = 4294967301 is outside int32"):
        _core.block_key(root, np.array([2**32 + 5], np.int64))
    with pytest.raises(ValueError, match="tokens must hold integers"):
        _core.block_key(root, [5.0])
    assert _core.block_key(root, np.array([5], np.int64)) == _core.block_key(root, [5])
    assert _core.block_key(root, np.array([-1], np.int8)) == _core.block_key(root, [-1])
    assert len(_core.block_key(root, [])) == 16
