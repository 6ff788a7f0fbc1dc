"""benchmarks/roofline.py: the work it counts against a direct count, the floors it derives, and
bench_throughput's command line writing the results it reads (tiny sizes, pagedllm alone)."""

import json

import pytest

from benchmarks import bench_throughput, common, roofline
from benchmarks.workloads import BenchRequest, MIXED
from pagedllm.model.checkpoint import random_config


def _direct_flops(cfg, prompt: int, output: int) -> dict:
    """The same work counted token by token, from the config's shapes."""
    h, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    per_token = layers * (h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h) + h  # + norms
    proj = attn = 0
    for t in range(prompt + output - 1):  # position t is fed through every layer
        proj += 2 * per_token
        attn += layers * cfg.num_attention_heads * (2 * cfg.head_dim * (t + 1)) * 2
    head = 2 * cfg.vocab_size * h * output
    return {"projections": proj, "lm_head": head, "attention": attn}


@pytest.mark.parametrize("preset", ["tiny", "1b"])
def test_flops_match_a_direct_count(preset):
    cfg = random_config(preset)
    reqs = [BenchRequest([5] * 7, 3), BenchRequest([5] * 1, 1)]
    got = roofline.workload_flops(cfg, reqs)
    want = [_direct_flops(cfg, 7, 3), _direct_flops(cfg, 1, 1)]
    for k in ("projections", "lm_head", "attention"):
        assert got[k] == pytest.approx(sum(w[k] for w in want), rel=1e-12)
    assert got["total"] == pytest.approx(got["projections"] + got["lm_head"] + got["attention"])


def test_floor_is_the_larger_bound():
    cfg = random_config("tiny")
    one = [BenchRequest([5] * 4, 100)]
    fl = roofline.floor_s(cfg, one, "float32", peak_flops=1e15, bandwidth=1e9)
    assert fl["bound"] == "bandwidth"
    assert fl["stream_s"] == pytest.approx(100 * cfg.num_parameters() * 4 / 1e9)
    assert fl["floor_s"] == fl["stream_s"]
    fl = roofline.floor_s(cfg, one, "bfloat16", peak_flops=1e6, bandwidth=1e12)
    assert fl["bound"] == "compute" and fl["floor_s"] == fl["compute_s"]


def test_command_line_run_and_analysis(tmp_path, monkeypatch):
    monkeypatch.setenv(common.RESULTS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(common.CHECKPOINT_CACHE_ENV, str(tmp_path / "ckpt"))
    monkeypatch.setattr(bench_throughput, "wait_until_quiet", lambda: 0.0)  # no timing here
    bench_throughput.main(["--models", "tiny", "--peers", "none", "--mixed-requests", "3",
                           "--concurrency", "1,2", "--repeats", "1", "--concurrency-repeats",
                           "1", "--long-prompt", "2,40,60,3", "--name", "smoke"])
    results = json.loads((tmp_path / "smoke.json").read_text())
    assert results["config"]["mixed"] == dict(MIXED, n=3)
    rows = roofline.analyse(results, peak=1e11, bandwidth=1e10)
    assert [r["workload"] for r in rows] == ["mixed", "1 at once", "2 at once", "long prompts"]
    model = results["models"]["tiny"]
    long_s = model["long_prompt"]["runs"]["pagedllm"][0]["elapsed_s"]
    long_row = rows[-1]
    assert long_row["elapsed_s"]["pagedllm"] == pytest.approx(long_s, abs=1e-3)
    cfg = random_config("tiny")
    reqs = roofline._workloads(model, cfg.vocab_size)["long prompts"]
    assert len(reqs) == 2 and all(40 <= len(r.prompt_token_ids) <= 60 for r in reqs)
    floor = roofline.floor_s(cfg, reqs, "float32", 1e11, 1e10)["floor_s"]
    assert long_row["fraction_of_floor"]["pagedllm"] == pytest.approx(floor / long_s, abs=1e-3)
    assert long_row["largest_possible_ratio"] == {}  # no peer ran
    rates = roofline.peak_flops("float32", rounds=1)
    assert rates["peak"] == max(rates["torch_mm"], rates["pagedllm"]) > 0
