"""benchmarks/bf16_probs_ab.py end to end on small shapes: it times both kernels under the exact
engine and "auto" and writes one row per (kernel, shape). No timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import bf16_probs_ab, common  # noqa: E402
from pagedllm import _core  # noqa: E402

HAS_TILE = ("avx512bf16" in _core.build_info()["cpu_features"]
            and "avx512" in _core.cpu_engines())


@pytest.mark.skipif(not HAS_TILE, reason="no AVX512_BF16: auto is exact on this CPU")
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_writes_a_row_per_kernel_and_shape(tmp_path, monkeypatch, kv):
    monkeypatch.setenv(common.RESULTS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(bf16_probs_ab, "PREFILL", (1, 64))
    monkeypatch.setattr(bf16_probs_ab, "DECODE", (2, 64))
    monkeypatch.setattr(sys, "argv", ["bf16_probs_ab", "--rounds", "2", "--kv", kv])
    bf16_probs_ab.main()
    assert _core.get_cpu_engine() == _core.cpu_engines()[0]  # "auto" restored
    name = "bf16_probs_ab.json" if kv == "bf16" else f"bf16_probs_ab_{kv}.json"
    data = json.loads((tmp_path / name).read_text())
    rows = data["rows"]
    assert [(r["kernel"], r["shape"]) for r in rows] == [
        (k, s[0]) for s in bf16_probs_ab.SHAPES for k in ("prefill", "decode")]
    for r in rows:
        assert r["exact_ms"] > 0 and r["auto_ms"] > 0 and len(r["speedup_rounds"]) == 2
        unit = "gflops" if r["kernel"] == "prefill" else "gbps"
        assert r[f"exact_{unit}"] > 0 and r[f"auto_{unit}"] > 0
