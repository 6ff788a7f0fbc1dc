"""The fused-kernel benchmarks run at tiny sizes, so that their commands cannot rot."""

from benchmarks import bench_fused_ops, decode_step_ab


def test_bench_fused_ops_measures_every_op_and_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_BENCH_RESULTS_DIR", str(tmp_path))
    r = bench_fused_ops.run(threads=1, repeats=1, dtypes=("float32",))
    ops = {(x["op"], x["model"], x["rows"]) for x in r["rows"]}
    assert len(ops) == 3 * len(bench_fused_ops.SHAPES)
    assert all(x["fused_us"] > 0 for x in r["rows"])
    assert "| add + RMSNorm | float32 | tiny x 64 |" in bench_fused_ops.markdown(r)
    assert (tmp_path / "fused_ops.json").exists()


def test_decode_step_ab_table_names_every_bucket():
    side = {"step_ms": 2.0, "step_cpu_ms": 1.5, "floor_ms": {}, "floor_ms_total": 0.5,
            "profiled_ms_per_step": {"sampler": 0.2, "attention kernel": 0.0}, "loads": [1.0]}
    r = {"threads": 1, "rounds": 1, "before": "abc", "after": "def",
         "points": [{"model": "tiny", "batch": 4, "before": side, "after": side}]}
    table = decode_step_ab.markdown(r)
    assert "| main-thread CPU time | 1.50 | 1.50 | 1.00x |" in table
    assert "| cProfile: sampler | 0.20 | 0.20 | 1.00x |" in table
