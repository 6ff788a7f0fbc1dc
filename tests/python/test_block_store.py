"""pagedllm._core.BlockStore: the binding's API and errors, and the store's crash behaviour.

Throughput is measured in benchmarks/bench_block_store.py, not here.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from pagedllm import _core

BACKENDS = _core.build_info()["block_store_backends"]
FP = "llama-test|float32|layout-v1"
BS = 16


def tokens_of(i):
    return np.arange(i * BS, (i + 1) * BS, dtype=np.int32)


def payload_of(i, n=4096):
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


def key_of(i):
    return _core.block_key(_core.ROOT_BLOCK_KEY, tokens_of(i))


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def can_mount():
    if os.geteuid() != 0:
        return False
    probe = "/tmp/pagedllm_mount_probe"
    os.makedirs(probe, exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe],
                        capture_output=True).returncode == 0
    if ok:
        subprocess.run(["umount", probe], check=False)
    return ok


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only): a disk that fills up, and can be remounted read-only."""
    if not can_mount():
        pytest.skip("needs root and permission to mount a tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# ---- keys ------------------------------------------------------------------------------

def test_block_key_is_deterministic_and_chained():
    assert isinstance(_core.ROOT_BLOCK_KEY, bytes) and len(_core.ROOT_BLOCK_KEY) == 16
    t = tokens_of(0)
    k = _core.block_key(_core.ROOT_BLOCK_KEY, t)
    assert isinstance(k, bytes) and len(k) == 16
    assert k == _core.block_key(_core.ROOT_BLOCK_KEY, list(t), 0)
    assert k != _core.block_key(_core.ROOT_BLOCK_KEY, t, extra_key=1)
    assert k != _core.block_key(_core.ROOT_BLOCK_KEY, t[:-1])
    child = _core.block_key(k, tokens_of(1))
    assert child != _core.block_key(_core.ROOT_BLOCK_KEY, tokens_of(1))
    # Stable across processes (it names files on disk).
    out = subprocess.run(
        [sys.executable, "-c",
         "import numpy as np; from pagedllm import _core; "
         "print(_core.block_key(_core.ROOT_BLOCK_KEY, np.arange(16, dtype=np.int32)).hex())"],
        capture_output=True, text=True, check=True, env=os.environ).stdout.strip()
    assert out == k.hex()


def test_block_key_bad_arguments():
    with pytest.raises(ValueError, match="16 bytes"):
        _core.block_key(b"short", tokens_of(0))
    with pytest.raises(ValueError, match="1-D"):
        _core.block_key(_core.ROOT_BLOCK_KEY, np.zeros((2, 2), dtype=np.int32))


def test_build_info_lists_backends():
    assert BACKENDS[0] == "file"
    assert set(BACKENDS) <= {"file", "rocksdb"}


# ---- API ---------------------------------------------------------------------------------

def test_round_trip_and_stats(tmp_path, backend):
    with _core.BlockStore(str(tmp_path / "s"), backend=backend) as s:
        assert s.backend == backend and not s.closed
        k, t, p = key_of(1), tokens_of(1), payload_of(1)
        assert not s.contains(k) and k not in s and len(s) == 0
        assert s.get(k, FP, BS, t) is None
        assert s.put(k, FP, BS, t, p) is True
        assert s.contains(k) and k in s and len(s) == 1
        assert s.get(k, FP, BS, t) == p.tobytes()
        out = np.zeros_like(p)
        assert s.get_into(k, FP, BS, t, out) is True
        np.testing.assert_array_equal(out, p)
        # Any C-contiguous buffer: float32 view of the same bytes, bytes, bytearray, memoryview.
        f32 = np.empty(p.size // 4, dtype=np.float32)
        assert s.get_into(k, FP, BS, t, f32) and f32.tobytes() == p.tobytes()
        ba = bytearray(p.size)
        assert s.get_into(k, FP, BS, t, ba) and bytes(ba) == p.tobytes()
        assert s.put(key_of(2), FP, BS, tokens_of(2), p.tobytes())
        assert s.put(key_of(3), FP, BS, tokens_of(3), memoryview(p.tobytes()))
        # Size mismatch: a miss, record kept.
        assert s.get_into(k, FP, BS, t, np.zeros(p.size + 1, np.uint8)) is False
        assert s.contains(k)
        assert sorted(s.keys()) == sorted([key_of(1), key_of(2), key_of(3)])
        st = s.stats()
        for field in ("records", "bytes", "hits", "misses", "corrupt_dropped", "bytes_read",
                      "bytes_written", "evictions", "write_errors", "max_bytes"):
            assert isinstance(st[field], int), field
        assert st["backend"] == backend
        assert st["records"] == 3 and st["hits"] == 4 and st["misses"] == 2
        assert st["bytes"] > 3 * p.size
        assert s.erase(k) is True and s.erase(k) is False
        assert s.get(k, FP, BS, t) is None
    assert s.closed
    with pytest.raises(RuntimeError, match="closed"):
        s.contains(k)
    s.close()  # idempotent


def test_torch_tensor_payload(tmp_path, backend):
    torch = pytest.importorskip("torch")
    with _core.BlockStore(str(tmp_path / "s"), backend) as s:
        block = torch.randn(8, 2, 4, 16, 8)  # a KV block view: layers x (k, v) x heads x ...
        k, t = key_of(5), tokens_of(5)
        assert s.put(k, FP, BS, t, block)
        dst = torch.zeros_like(block)
        assert s.get_into(k, FP, BS, t, dst)
        assert torch.equal(dst, block)
        # Block-major KV pool (docs/ARCHITECTURE.md, "KV pool layout"): pool[b] is one block.
        pool = torch.randn(6, 8, 2, 4, 16, 8).to(torch.bfloat16)
        assert s.put(key_of(6), FP, BS, tokens_of(6), pool[2])
        assert s.get_into(key_of(6), FP, BS, tokens_of(6), pool[4])
        assert torch.equal(pool[4], pool[2])
        u8 = pool.view(torch.uint8)  # fp8 pools are uint8 bytes
        assert s.get_into(key_of(6), FP, BS, tokens_of(6), u8[5])
        assert torch.equal(pool[5], pool[2])
        # A non-contiguous view is refused with a clear error.
        with pytest.raises(ValueError):
            s.put(k, FP, BS, t, block.transpose(0, 1))
        with pytest.raises(ValueError):
            s.get_into(k, FP, BS, t, dst.transpose(0, 1))


def test_mismatching_records_are_misses_and_erased(tmp_path, backend):
    with _core.BlockStore(str(tmp_path / "s"), backend) as s:
        k, t, p = key_of(1), tokens_of(1), payload_of(1)
        other_tokens = t.copy()
        other_tokens[3] += 1
        for args in (("another-model", BS, t), (FP, BS * 2, t), (FP, BS, other_tokens),
                     (FP, BS, t[:-1])):
            assert s.put(k, FP, BS, t, p)
            assert s.get(k, *args) is None
            assert not s.contains(k)
        assert s.stats()["mismatch_dropped"] == 4


def test_argument_errors(tmp_path):
    with _core.BlockStore(str(tmp_path / "s")) as s:
        with pytest.raises(ValueError, match="16 bytes"):
            s.put(b"x" * 15, FP, BS, tokens_of(0), payload_of(0))
        with pytest.raises(ValueError, match="buffer"):
            s.put(key_of(0), FP, BS, tokens_of(0), 12345)
        with pytest.raises(ValueError, match="writable"):
            s.get_into(key_of(0), FP, BS, tokens_of(0), b"read-only bytes")
        ro = np.zeros(16, np.uint8)
        ro.flags.writeable = False
        with pytest.raises(ValueError):
            s.get_into(key_of(0), FP, BS, tokens_of(0), ro)
    with pytest.raises(ValueError, match="unknown block store backend"):
        _core.BlockStore(str(tmp_path / "t"), backend="tape")
    if "rocksdb" not in BACKENDS:
        with pytest.raises(ValueError, match="not compiled"):
            _core.BlockStore(str(tmp_path / "t"), backend="rocksdb")


def test_missing_directory_is_created(tmp_path, backend):
    path = tmp_path / "a" / "b" / "c"
    with _core.BlockStore(str(path), backend) as s:
        assert s.put(key_of(0), FP, BS, tokens_of(0), payload_of(0))
    assert path.is_dir()


def test_second_opener_refused_and_reopen_finds_records(tmp_path, backend):
    path = str(tmp_path / "s")
    s = _core.BlockStore(path, backend)
    for i in range(10):
        assert s.put(key_of(i), FP, BS, tokens_of(i), payload_of(i))
    with pytest.raises(OSError, match="already open") as e:
        _core.BlockStore(path, backend)
    assert path in str(e.value)
    # Another process is refused too.
    code = textwrap.dedent(f"""
        from pagedllm import _core
        try:
            _core.BlockStore({path!r}, {backend!r})
        except OSError as e:
            print("refused:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=os.environ)
    assert "refused:" in out.stdout and "already open" in out.stdout, out
    s.close()
    with _core.BlockStore(path, backend) as s2:
        assert len(s2) == 10
        for i in range(10):
            assert s2.get(key_of(i), FP, BS, tokens_of(i)) == payload_of(i).tobytes()


def test_lru_eviction_under_max_bytes(tmp_path, backend):
    p = payload_of(0, 10000)
    with _core.BlockStore(str(tmp_path / "probe"), backend) as s:
        s.put(key_of(0), FP, BS, tokens_of(0), p)
        rec = s.stats()["bytes"]
    with _core.BlockStore(str(tmp_path / "s"), backend, max_bytes=3 * rec) as s:
        for i in range(3):
            assert s.put(key_of(i), FP, BS, tokens_of(i), p)
        assert s.get(key_of(0), FP, BS, tokens_of(0)) is not None  # 1 is now the oldest
        assert s.put(key_of(3), FP, BS, tokens_of(3), p)
        assert s.contains(key_of(0)) and not s.contains(key_of(1))
        st = s.stats()
        assert st["evictions"] == 1 and st["records"] == 3 and st["bytes"] <= 3 * rec
        assert st["max_bytes"] == 3 * rec
        # Larger than the cap: refused.
        assert s.put(key_of(9), FP, BS, tokens_of(9), payload_of(9, 40000)) is False
        assert s.stats()["write_errors"] == 1


def test_concurrent_threads(tmp_path, backend):
    errors = []
    with _core.BlockStore(str(tmp_path / "s"), backend) as s:
        def work(tid):
            try:
                for n in range(30):
                    i = n % 8
                    assert s.put(key_of(i), FP, BS, tokens_of(i), payload_of(i))
                    got = s.get(key_of(i), FP, BS, tokens_of(i))
                    assert got is None or got == payload_of(i).tobytes()
                    s.contains(key_of((i + 1) % 8))
                    if tid == 0 and n % 5 == 0:
                        s.erase(key_of(i))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        assert s.stats()["corrupt_dropped"] == 0


# ---- faults ------------------------------------------------------------------------------

KILL_PAYLOAD = 4 * 1024 * 1024  # large, so that most of the writer's time is spent writing


def kill_payload(i):
    """Record i of the kill -9 writer: one of 4 random buffers, its first 8 bytes = i."""
    p = np.random.default_rng(i % 4).integers(0, 256, KILL_PAYLOAD, dtype=np.uint8)
    p[:8] = np.frombuffer(np.int64(i).tobytes(), dtype=np.uint8)
    return p


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from pagedllm import _core
    path, backend, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = _core.BlockStore(path, backend)
    BS = 16
    base = [np.random.default_rng(j).integers(0, 256, n, dtype=np.uint8) for j in range(4)]
    i = 0
    while True:
        t = np.arange(i * BS, (i + 1) * BS, dtype=np.int32)
        k = _core.block_key(_core.ROOT_BLOCK_KEY, t)
        p = base[i % 4]
        p[:8] = np.frombuffer(np.int64(i).tobytes(), dtype=np.uint8)
        s.put(k, "fp", BS, t, p)
        print(i, flush=True)
        i += 1
""")


def test_kill_9_during_writes(tmp_path, backend):
    path = str(tmp_path / "s")
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = np.random.default_rng(0)
    last = 2
    for _round in range(4):
        proc = subprocess.Popen([sys.executable, str(script), path, backend, str(KILL_PAYLOAD)],
                                stdout=subprocess.PIPE, text=True, env=os.environ)
        # Let it confirm a few puts, then kill it at a random moment while it keeps writing
        # (each round rewrites the same keys, so replacements are interrupted too).
        for _ in range(3):
            assert proc.stdout.readline(), "the writer died before writing"
        time.sleep(float(rng.uniform(0.0, 0.1)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        confirmed = [int(x) for x in proc.stdout.read().split()]
        last = max([last] + confirmed)  # over all rounds: earlier ones may have gone further
        by_key = {}
        for i in range(last + 2):  # last + 1 may have been in flight
            t = np.arange(i * 16, (i + 1) * 16, dtype=np.int32)
            by_key[_core.block_key(_core.ROOT_BLOCK_KEY, t)] = (i, t)
        with _core.BlockStore(path, backend) as s:
            keys = s.keys()
            assert set(keys) <= set(by_key), "a record under a key the writer never used"
            out = np.empty(KILL_PAYLOAD, np.uint8)
            for k in keys:
                i, t = by_key[k]
                # Every record verifies or is absent: a hit is always the exact payload.
                if s.get_into(k, "fp", 16, t, out):
                    np.testing.assert_array_equal(out, kill_payload(i))
            # The puts the writer confirmed (it printed after put returned) all survived.
            for k, (i, t) in by_key.items():
                if i <= last:
                    assert s.get_into(k, "fp", 16, t, out), i
            assert s.stats()["corrupt_dropped"] == 0  # the rename is atomic: no torn record
            # Usable after the crash.
            assert s.put(key_of(99999), FP, BS, tokens_of(99999), payload_of(1))
            assert s.erase(key_of(99999))
        if backend == "file":
            leftovers = [f for _, _, fs in os.walk(path) for f in fs if ".tmp." in f]
            assert not leftovers


def test_unusable_path_is_a_clear_error_at_open(tmp_path, backend):
    regular = tmp_path / "regular-file"
    regular.write_text("x")
    with pytest.raises(OSError) as e:
        _core.BlockStore(str(regular / "store"), backend)
    assert str(regular) in str(e.value)
    with pytest.raises(OSError):
        _core.BlockStore(str(regular), backend)  # the path itself is a file


def test_no_permission_is_a_clear_error_at_open(tmp_path, backend):
    # As root, permission bits do not apply: run the check as an unprivileged user instead.
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    code = textwrap.dedent(f"""
        from pagedllm import _core
        try:
            _core.BlockStore({str(locked / "store")!r}, {backend!r})
            print("OPENED")
        except OSError as e:
            print("OSError:", e)
    """)
    kwargs = {}
    if os.geteuid() == 0:
        os.chmod(tmp_path, 0o755)
        kwargs = {"user": 65534, "group": 65534}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=os.environ, cwd="/", **kwargs)
    except PermissionError as e:
        pytest.skip(f"an unprivileged user cannot run this interpreter here: {e}")
    if "OSError:" not in proc.stdout and "OPENED" not in proc.stdout:
        pytest.skip(f"the unprivileged interpreter could not run: {proc.stderr[-300:]}")
    assert "OSError:" in proc.stdout, proc.stdout
    assert str(locked) in proc.stdout
    assert "Permission denied" in proc.stdout


def test_read_only_filesystem(tiny_tmpfs, backend):
    # Read-only at open: a clear error.
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    with pytest.raises(OSError) as e:
        _core.BlockStore(str(tiny_tmpfs / "store"), backend)
    assert str(tiny_tmpfs) in str(e.value)
    if backend != "file":
        return  # RocksDB keeps its WAL open for writing: the remount below would be refused
    # Read-only after open (EROFS): put returns False, reads still work.
    subprocess.run(["mount", "-o", "remount,rw", str(tiny_tmpfs)], check=True)
    s = _core.BlockStore(str(tiny_tmpfs / "store"), backend)
    try:
        small = payload_of(1, 512)
        assert s.put(key_of(1), FP, BS, tokens_of(1), small)
        subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
        assert s.put(key_of(2), FP, BS, tokens_of(2), small) is False
        assert s.stats()["write_errors"] == 1
        assert s.get(key_of(1), FP, BS, tokens_of(1)) == small.tobytes()
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_tmpfs)], check=False)
        s.close()


def test_full_disk_put_returns_false(tiny_tmpfs):
    # The file backend only: RocksDB preallocates its WAL and manifest, which a 64 KiB disk
    # cannot hold at all.
    with _core.BlockStore(str(tiny_tmpfs / "store")) as s:
        assert s.put(key_of(1), FP, BS, tokens_of(1), payload_of(1, 1024))
        big = payload_of(2, 256 * 1024)  # larger than the whole disk
        assert s.put(key_of(2), FP, BS, tokens_of(2), big) is False
        assert s.stats()["write_errors"] == 1
        assert not s.contains(key_of(2))
        leftovers = [f for _, _, fs in os.walk(tiny_tmpfs) for f in fs if ".tmp." in f]
        assert not leftovers  # the partial temporary file was removed
        # The store keeps working once space is there.
        assert s.get(key_of(1), FP, BS, tokens_of(1)) == payload_of(1, 1024).tobytes()
        assert s.put(key_of(3), FP, BS, tokens_of(3), payload_of(3, 1024))
