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


def test_malloc_ab_runs_both_settings(tmp_path, monkeypatch):
    """benchmarks/malloc_ab.py on two short prompts: a process per setting, faults counted."""
    import json
    import sys

    from benchmarks import common, malloc_ab

    monkeypatch.setenv(common.RESULTS_DIR_ENV, str(tmp_path / "results"))
    monkeypatch.setenv(common.CHECKPOINT_CACHE_ENV, str(tmp_path / "ckpt"))
    monkeypatch.setattr(sys, "argv", ["malloc_ab", "--rounds", "1", "--runs", "2",
                                      "--long-prompt", "2,32,64,4"])
    malloc_ab.main()
    data = json.loads((tmp_path / "results" / "malloc_ab_tiny_float32_long.json").read_text())
    assert set(data["processes"]) == {"0", "1"}
    for procs in data["processes"].values():
        assert len(procs) == 1 and len(procs[0]) == 2
        assert all(run["wall_s"] > 0 and run["minor_faults"] >= 0 for run in procs[0])
    assert data["summary"]["speedup"] > 0
