"""benchmarks/decode_short.py end to end on small cases: the pools it makes, and one row per
(shape, thread count) with both rates. No timing is asserted."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import common, decode_short  # noqa: E402
from pagedllm import _core  # noqa: E402


def test_shapes_come_from_the_presets():
    assert decode_short.shape_of("tiny") == (8, 2, 32)
    assert decode_short.shape_of("small") == (16, 4, 64)


def test_pool_covers_every_sequence_with_distinct_blocks():
    pool = decode_short.make_pool(8, 2, 32, batch=5, context=40, gen=torch.Generator().manual_seed(1))
    assert pool["tables"].shape == (5, 3)  # 40 tokens: 3 blocks of 16
    assert sorted(pool["tables"].flatten().tolist()) == list(range(15))
    assert pool["kc"].shape == (15, 2, 16, 32) and pool["lens"].tolist() == [40] * 5
    assert pool["kv_bytes"] == 2 * 5 * 40 * 2 * 32 * 4


def test_warm_pool_keeps_half_the_cache():
    pool = decode_short.make_pool(8, 2, 32, batch=8, context=32, gen=torch.Generator().manual_seed(2))
    per_seq = pool["kv_bytes"] // 8  # 32 KiB
    assert decode_short.warm_pool(pool, 1 << 30) is pool
    cut = decode_short.warm_pool(pool, 6 * per_seq)  # half of it: 3 sequences
    assert cut["lens"].numel() == 3 and cut["tables"].shape == (3, 2)
    assert cut["kv_bytes"] == 3 * per_seq and cut["kc"] is pool["kc"]
    assert decode_short.warm_pool(pool, 1)["lens"].numel() == 1


def test_writes_a_row_per_shape_and_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv(common.RESULTS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(decode_short, "CALLS", 4)
    monkeypatch.setattr(decode_short, "last_level_cache_bytes", lambda: 1 << 20)
    threads = _core.get_num_threads()
    result = decode_short.main(["--rounds", "2", "--batch", "4", "--context", "40",
                                "--shapes", "tiny,small", "--probe-gib", "0.01"])
    assert _core.get_num_threads() == threads  # restored
    data = json.loads((tmp_path / "decode_short.json").read_text())
    assert data["command"].startswith("benchmarks/decode_short.py --rounds 2")
    rows = data["rows"]
    want = {(s, t) for s in ("tiny", "small") for t in sorted({1, threads})}
    assert {(r["shape"], r["threads"]) for r in rows} == want
    for r in rows:
        assert len(r["dram_runs_us"]) == len(r["warm_runs_us"]) == len(r["probe_gbps"]) == 2
        assert all(math.isfinite(x) and x > 0 for x in r["dram_runs_us"] + r["warm_runs_us"])
        # the pools together span at least twice the (patched) cache
        assert r["pools"] * r["kv_bytes_per_call"] >= 2 * (1 << 20)
        assert r["dram_over_warm"] > 0 and r["dram_over_probe"] > 0
    assert "| tiny 8/2/32, 4 x 40 |" in decode_short.markdown(result["rows"])
