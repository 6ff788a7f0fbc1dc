"""bench_attention's decode cases: each storage case builds the caches and the query it names
and the kernel decodes them as a model of that dtype would (fp8 and bf16 with a bf16 query go
to the bf16 dot products where the CPU has them, like vLLM's peer case; fp8_fp32q and
bf16_fp32q stay exact). No timing is asserted."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import bench_attention as ba  # noqa: E402
from cpu_engines import restore  # noqa: E402
from pagedllm import _core  # noqa: E402


@pytest.fixture(autouse=True)
def auto_engine(monkeypatch):
    monkeypatch.delenv("PAGEDLLM_CPU_ENGINE", raising=False)
    _core.set_cpu_engine("auto")
    yield
    restore()


@pytest.mark.parametrize("storage", list(ba.STORAGE))
@pytest.mark.parametrize("block", [ba.BLOCK, ba.BIG_BLOCK])
def test_case_decodes_like_the_engine_it_names(storage, block):
    gen = torch.Generator().manual_seed(1)
    c = ba.make_decode_case(2, 256, storage, gen, block, sdpa=block == ba.BLOCK)
    cache_dtype, kv_cache_dtype, act = ba.STORAGE[storage]
    assert c["q"].dtype == act and c["kc"].dtype == cache_dtype
    assert c["kv_bytes"] == 2 * 2 * 256 * ba.KV_HEADS * ba.HEAD_DIM * c["kc"].element_size()
    scale = 1.0 / math.sqrt(ba.HEAD_DIM)

    def decode(engine):
        _core.set_cpu_engine(engine)
        out = torch.full_like(c["q"], float("nan"))
        _core.paged_attention_decode(out, c["q"], c["kc"], c["vc"], c["tables"], c["lens"],
                                     scale, kv_cache_dtype)
        return out

    named = ba.decode_kernel(storage)
    assert named in _core.cpu_engines()
    assert torch.equal(decode("auto"), decode(named))
    if block == ba.BLOCK:  # SDPA's copy holds the same values (fp8 as bf16)
        ref = torch.nn.functional.scaled_dot_product_attention(
            c["q_sdpa"].float(), c["k_sdpa"].float(), c["v_sdpa"].float(), scale=scale,
            enable_gqa=True).reshape(c["q"].shape)
        assert torch.allclose(decode("auto").float(), ref, atol=3e-2, rtol=3e-2)


def test_peer_gets_its_fp8_case_for_both_fp8_queries():
    assert ba.peer_storage("fp8") == ba.peer_storage("fp8_fp32q") == "fp8"
    assert ba.peer_storage("bf16") == "bf16"


def test_rates_against_the_highest_probe_of_the_run():
    # The probe steps between levels on a shared host while the kernels' rates stay put: each
    # case is also given as a fraction of the run's highest probe, which the steps do not move.
    from benchmarks.bench_attention import Bandwidth

    bw = Bandwidth.__new__(Bandwidth)  # no 1 GiB buffer: only the bookkeeping
    bw.lowest, bw.highest = 35e9, 64e9
    rows = [dict(storage="fp32", batch=16, context=2048, kv_gbps=32.0),
            dict(storage="fp8", batch=1, context=8192, engine="avx512_bf16", kv_gbps=16.0)]
    line = bw.against_highest(rows)
    assert [r["frac_of_run_max_bw"] for r in rows] == [0.5, 0.25]
    assert line == ("probes of this run: 35.0-64.0 GB/s; each kernel rate over the highest: "
                    "fp32 16x2048 0.50, fp8 1x8192 avx512_bf16 0.25")
