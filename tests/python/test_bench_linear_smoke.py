"""bench_linear at tiny sizes, so that its command cannot rot."""

import pytest
import torch

from benchmarks import bench_linear
from pagedllm.model import packed_linear


def test_projection_shapes_of_small():
    shapes = bench_linear.projection_shapes("small")
    assert shapes == {"qkv": (1536, 1024), "o_proj": (1024, 1024), "gate_up": (5632, 1024),
                      "down": (1024, 2816), "lm_head": (32000, 1024)}


@pytest.mark.skipif(not packed_linear.onednn_available(), reason="torch built without oneDNN")
def test_time_shape_reports_both_backends():
    rows = bench_linear.time_shape(48, 32, torch.bfloat16, [1, 7], rounds=1, total_bytes=1e4)
    assert [r["rows"] for r in rows] == [1, 7]
    for r in rows:
        assert r["copies"] >= 1 and r["pagedllm_ms"] > 0 and r["onednn_ms"] > 0
        assert r["speedup"] == pytest.approx(r["onednn_ms"] / r["pagedllm_ms"])
