"""benchmarks/bench_multimodal.py --arch mllama at a tiny size, so that the command cannot rot:
three modes, only the encoder-reuse mode encodes the shared image once, and the KV figures
are what the configs say."""

from __future__ import annotations

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: benchmarks/


def test_bench_multimodal_mllama_quick_runs_the_three_modes():
    from benchmarks.bench_multimodal import main

    res = main(["--quick", "--arch", "mllama"])
    assert [(r["prefix_caching"], r["encoder_cache_images"]) for r in res] == [
        (False, 0), (True, 0), (True, 8)]
    # warm-up + 2 one-at-a-time requests + the batch (one encode shared by 3) = 4 without reuse
    assert [r["images_encoded"] for r in res] == [4, 4, 1]
    for r in res:
        assert r["vision_tokens_per_image"] == 4 * 5  # 2x2 tiles of (28 / 14)^2 + 1 tokens
        # 2 cross layers x 2 (K, V) x 4 KV heads x 32 x 4 bytes per token, 2 blocks of 16
        assert r["cross_kv_bytes_per_image_fp32"] == 2 * 16 * 2 * 2 * 4 * 32 * 4
        assert r["as_patch_tokens_kv_bytes_fp32"] == 20 * 4 * 2 * 4 * 32 * 4  # all 4 layers
