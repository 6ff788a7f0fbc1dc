"""benchmarks/decode_ceiling.py end to end on small cases: the case shapes it picks, and one
row per (storage, thread count) written with both rates. No timing is asserted."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import common, decode_ceiling  # noqa: E402
from pagedllm import _core  # noqa: E402


def test_cases_have_one_context_and_fill_half_the_cache():
    # fp32 K and V of 8 KV heads of 128: 8 KiB per token, 16 MiB / 8 sequences
    cache, dram = decode_ceiling.case_shapes("fp32", 32 << 20, threads=2, dram_bytes=256 << 20)
    assert cache == (8, 256) and dram == (128, 256)
    cache, dram = decode_ceiling.case_shapes("fp8", 32 << 20, threads=4, dram_bytes=256 << 20)
    assert cache == (16, 512) and dram[1] == cache[1]  # 2 KiB per token, 16 MiB / 16 sequences
    cache, _ = decode_ceiling.case_shapes("fp32", 1 << 20, threads=2)  # tiny cache: 64 floor
    assert cache == (8, 64)


def test_l2_case_reads_the_same_rows_from_a_few_blocks():
    import torch

    from benchmarks.bench_attention import make_decode_case

    case = make_decode_case(8, 256, "bf16", torch.Generator().manual_seed(0), sdpa=False)
    l2 = decode_ceiling.in_l2(case, "bf16", l2_bytes=256 << 10)
    # bf16 K and V of 8 KV heads of 128: 4 KiB per token, 64 KiB per 16-token block: 4 blocks
    assert l2["tables"].shape == case["tables"].shape
    assert set(l2["tables"].flatten().tolist()) == {0, 1, 2, 3}
    assert l2["kv_bytes"] == case["kv_bytes"] and l2["kc"] is case["kc"]
    assert decode_ceiling.in_l2(case, "bf16", l2_bytes=1)["tables"].max() == 0  # one block at least


def test_writes_a_row_per_storage_and_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv(common.RESULTS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(decode_ceiling, "DRAM_BYTES", 8 << 20)
    monkeypatch.setattr(decode_ceiling, "CALL_BYTES", 1 << 20)
    monkeypatch.setattr(decode_ceiling, "last_level_cache_bytes", lambda: 4 << 20)
    threads = _core.get_num_threads()
    result = decode_ceiling.main(["--rounds", "2", "--storages", "fp32,fp8", "--probe-gib",
                                  "0.01"])
    assert _core.get_num_threads() == threads  # restored
    data = json.loads((tmp_path / "decode_ceiling.json").read_text())
    assert data["command"].startswith("benchmarks/decode_ceiling.py --rounds 2")
    rows = data["rows"]
    want = {(s, t) for s in ("fp32", "fp8") for t in sorted({1, threads})}
    assert {(r["storage"], r["threads"]) for r in rows} == want
    for r in rows:
        runs = r["dram_runs_gbps"] + r["cache_runs_gbps"] + r["l2_runs_gbps"]
        assert len(r["dram_runs_gbps"]) == len(r["cache_runs_gbps"]) == len(r["l2_runs_gbps"]) == 2
        assert all(math.isfinite(x) and x > 0 for x in runs)
        assert r["dram_over_l2"] > 0
        assert r["cache_case"][1] == r["dram_case"][1]  # one context
    assert "| fp8 |" in decode_ceiling.markdown(result)
