"""Persistent KV block store throughput (pagedllm._core.BlockStore), every compiled backend.

Records are KV blocks of the "small" preset: 16 tokens x 8 layers x 2 (K, V) x 4 KV heads x
64 head dims (hidden 1024 / 16 heads) x 4 bytes (fp32 KV) = 256 KiB each. Measures, per backend:
- put: MB/s and records/s writing N fresh records (fsync off, the engine's default; the file
  backend also with fsync on);
- get_into: MB/s and records/s reading them back into a preallocated block (verify included),
  warm (page cache) and, when this process may drop the page cache (root), cold;
- reopen: seconds to open the store again (index rebuild) with N records on disk.

Usage: python -m benchmarks.bench_block_store [--records N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from benchmarks.common import write_results
from pagedllm import _core

BLOCK_TOKENS = 16
BLOCK_BYTES = BLOCK_TOKENS * 8 * 2 * 4 * 64 * 4  # 256 KiB
FINGERPRINT = "bench-small|float32|layers8-kv4-d64"


def _keys(n: int) -> list[tuple[bytes, np.ndarray]]:
    out, parent = [], _core.ROOT_BLOCK_KEY
    for i in range(n):
        t = np.arange(i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS, dtype=np.int32)
        parent = _core.block_key(parent, t)  # one long chained prompt
        out.append((parent, t))
    return out


def _drop_page_cache() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _rate(n: int, seconds: float) -> dict:
    return {"seconds": round(seconds, 4), "records_per_s": round(n / seconds, 1),
            "mb_per_s": round(n * BLOCK_BYTES / seconds / 1e6, 1)}


def bench_backend(backend: str, n: int, root: str, fsync: bool = False) -> dict:
    """put / get_into / reopen figures of one backend over n fresh records under root."""
    path = os.path.join(root, f"{backend}{'-fsync' if fsync else ''}")
    shutil.rmtree(path, ignore_errors=True)
    keys = _keys(n)
    payloads = [np.random.default_rng(i).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)
                for i in range(min(n, 16))]
    res: dict = {"backend": backend, "fsync": fsync, "records": n, "record_bytes": BLOCK_BYTES}
    s = _core.BlockStore(path, backend, fsync=fsync)
    t0 = time.perf_counter()
    for i, (k, t) in enumerate(keys):
        assert s.put(k, FINGERPRINT, BLOCK_TOKENS, t, payloads[i % len(payloads)])
    res["put"] = _rate(n, time.perf_counter() - t0)
    out = np.empty(BLOCK_BYTES, dtype=np.uint8)
    t0 = time.perf_counter()
    for k, t in keys:
        assert s.get_into(k, FINGERPRINT, BLOCK_TOKENS, t, out)
    res["get_warm"] = _rate(n, time.perf_counter() - t0)
    st = s.stats()
    res["bytes_on_disk"] = st["bytes"]
    s.close()
    if _drop_page_cache():
        t0 = time.perf_counter()
        s = _core.BlockStore(path, backend)
        res["reopen_cold_s"] = round(time.perf_counter() - t0, 4)
        t0 = time.perf_counter()
        for k, t in keys:
            assert s.get_into(k, FINGERPRINT, BLOCK_TOKENS, t, out)
        res["get_cold"] = _rate(n, time.perf_counter() - t0)
        s.close()
    t0 = time.perf_counter()
    s = _core.BlockStore(path, backend)
    res["reopen_warm_s"] = round(time.perf_counter() - t0, 4)
    assert len(s) == n
    s.close()
    shutil.rmtree(path, ignore_errors=True)
    return res


def main() -> dict:
    """Runs every backend, prints a table and writes benchmarks/results/block_store.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1024, help="records per run (256 KiB each)")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a "
                        "temporary directory under $TMPDIR)")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="pagedllm_bench_store_")
    os.makedirs(root, exist_ok=True)
    runs = []
    try:
        for backend in _core.build_info()["block_store_backends"]:
            runs.append(bench_backend(backend, args.records, root))
            if backend == "file":
                runs.append(bench_backend(backend, max(args.records // 4, 16), root, fsync=True))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{'backend':>14} {'records':>7} {'put MB/s':>9} {'put rec/s':>9} {'get MB/s':>9} "
          f"{'get rec/s':>9} {'cold MB/s':>9} {'reopen s':>8}")
    for r in runs:
        name = r["backend"] + ("+fsync" if r["fsync"] else "")
        cold = r.get("get_cold", {}).get("mb_per_s", float("nan"))
        print(f"{name:>14} {r['records']:>7} {r['put']['mb_per_s']:>9.1f} "
              f"{r['put']['records_per_s']:>9.1f} {r['get_warm']['mb_per_s']:>9.1f} "
              f"{r['get_warm']['records_per_s']:>9.1f} {cold:>9.1f} {r['reopen_warm_s']:>8.3f}")
    payload = {"block_bytes": BLOCK_BYTES, "runs": runs,
               "page_cache_dropped": any("get_cold" in r for r in runs)}
    path = write_results("block_store", payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
