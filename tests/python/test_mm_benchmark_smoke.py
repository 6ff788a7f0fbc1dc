"""benchmarks/bench_multimodal.py at a tiny size, so that the command cannot rot: three modes,
and only the encoder-cache mode encodes the shared image once."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks/


def test_bench_multimodal_quick_runs_the_three_modes():
    from benchmarks.bench_multimodal import main

    res = main(["--quick"])
    assert [(r["prefix_caching"], r["encoder_cache_images"]) for r in res] == [
        (False, 0), (True, 0), (True, 8)]
    # warm-up + 2 one-at-a-time requests + the batch (one encode shared by 3) = 4 without reuse
    assert [r["images_encoded"] for r in res] == [4, 4, 1]
    assert all(r["kv_bytes_per_image_fp32"] == 16 * 2 * 4 * 4 * 32 * 4 for r in res)
