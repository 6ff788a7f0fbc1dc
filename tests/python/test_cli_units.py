"""CLI pieces that need no model: parsing, config, one-line errors, printing, workloads, the
monitor's views."""

import argparse
import io
import json
import math
import sys
import types

import pytest

from pagedllm import cli
from pagedllm.commands import monitor
from pagedllm.commands.bench import format_results, summarize
from pagedllm.commands.bench_workload import assign_arrivals, from_file, percentiles, synthetic
from pagedllm.commands.common import CliError, UsageError, engine_config, parse_size
from pagedllm.commands.generate import OrderedPrinter
from pagedllm.config import EngineConfig
from pagedllm.outputs import CompletionOutput, RequestOutput


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def engine_args(*argv):
    return cli.build_parser().parse_args(["generate", "p", *argv])


# --- parsing and config ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [("1024", 1024), ("512MiB", 512 << 20), ("2GiB", 2 << 30),
                                        ("1.5GB", 1_500_000_000), ("64 KiB", 65536), ("3k", 3000)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "-1", "2XB", "GiB", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_flags_build_the_engine_config():
    cfg = engine_config(engine_args("--block-size", "8", "--kv-cache-memory", "64MiB",
                                    "--no-enable-prefix-caching", "--max-num-seqs", "4",
                                    "--num-threads", "1"))
    assert cfg == EngineConfig(block_size=8, kv_cache_memory_bytes=64 << 20,
                               enable_prefix_caching=False, max_num_seqs=4, num_threads=1)
    assert engine_config(engine_args()) == EngineConfig()


def test_worker_flags_build_the_engine_config():
    cfg = engine_config(engine_args("--device", "cpu", "--dtype", "bfloat16",
                                    "--preemption-mode", "swap", "--swap-space", "0.5",
                                    "--gpu-memory-utilization", "0.8"))
    assert (cfg.device, cfg.dtype, cfg.preemption_mode, cfg.swap_space,
            cfg.gpu_memory_utilization) == ("cpu", "bfloat16", "swap", 0.5, 0.8)


@pytest.mark.parametrize("argv,flag", [
    (["--device", "tpu"], "--device"), (["--swap-space", "-2"], "--swap-space"),
    (["--gpu-memory-utilization", "3"], "--gpu-memory-utilization")])
def test_bad_worker_flags_are_one_line_usage_errors(capsys, argv, flag):
    code, _, err = run_cli(capsys, "generate", "x", *argv)
    assert code == 2 and err.count("\n") == 1 and flag in err, err


def test_config_file_with_flags_winning(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text("model: /m\nkv_cache:\n  block_size: 32\n  num_blocks: 100\n"
                    "scheduler:\n  max_num_seqs: 8\nruntime:\n  seed: 3\n")
    cfg = engine_config(engine_args("--config", str(path), "--block-size", "8"))
    assert (cfg.model, cfg.block_size, cfg.num_kv_blocks, cfg.max_num_seqs, cfg.seed) == (
        "/m", 8, 100, 8, 3)


@pytest.mark.parametrize("yaml_text,match", [
    ("kv_cache:\n  bogus: 1\n", "unknown key 'kv_cache.bogus'"),
    ("quantization: {}\n", "unknown config section 'quantization'"),
    ("kv_cache:\n  block_size: 1000\n", "block_size must be"),
    ("kv_cache: [1, 2\n", "not valid YAML"),
    ("- a\n- b\n", "top level must be a mapping"),
])
def test_bad_config_files_are_usage_errors(tmp_path, yaml_text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(UsageError, match=match) as e:
        engine_config(engine_args("--config", str(path)))
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        engine_config(engine_args("--config", str(tmp_path / "nope.yaml")))


# --- errors ---------------------------------------------------------------------------------------
def test_usage_errors_are_one_line_exit_2(capsys):
    for argv in (["generate", "--bogus", "x"], ["generate", "--max-tokens", "zero", "x"],
                 ["nope"], [], ["generate", "x", "--watermark", "2"], ["generate"],
                 ["bench", "--kv-cache-memory", "lots"]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2, argv
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pagedllm: error: "), (argv, err)
        assert "(" in lines[0] and out == ""


def test_runtime_error_messages():
    assert cli.describe_error(FileNotFoundError("model directory 'x' not found (...)")) == (
        1, "model directory 'x' not found (...)")
    code, msg = cli.describe_error(ValueError(
        "the KV cache budget kv_cache_memory_bytes=10 holds no block at all; raise\n"
        "kv_cache_memory_bytes to at least 4096 (one block) or lower block_size"))
    assert code == 1 and "\n" not in msg and msg.endswith("(flags: --block-size, --kv-cache-memory)")
    assert cli.describe_error(CliError("x (y)", 1)) == (1, "x (y)")
    code, msg = cli.describe_error(ZeroDivisionError("boom"))
    assert code == 1 and "--verbose" in msg


def test_bundled_model_missing_is_one_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pagedllm.default_model", None)  # not in this build
    code, out, err = run_cli(capsys, "generate", "hi")
    assert code == 1 and err == ("pagedllm: error: the bundled default model is not part of this "
                                 "build (give a checkpoint directory with --model DIR)\n")
    broken = types.ModuleType("pagedllm.default_model")

    def default_model_path():
        raise RuntimeError("the bundled default model in /x lacks model.safetensors; the\n"
                           "installation is incomplete")

    broken.default_model_path = default_model_path
    monkeypatch.setitem(sys.modules, "pagedllm.default_model", broken)
    code, out, err = run_cli(capsys, "bench")
    assert code == 1 and err == ("pagedllm: error: the bundled default model in /x lacks "
                                 "model.safetensors; the installation is incomplete (or give a "
                                 "checkpoint directory with --model DIR)\n")


def test_verbose_shows_the_traceback(capsys, tmp_path):
    argv = ["generate", "--model", str(tmp_path / "missing"), "x"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and "not found" in err
    for verbose_argv in (["--verbose", *argv], [*argv[:1], "-v", *argv[1:]]):
        with pytest.raises(UsageError) as e:  # the traceback, down to the cause
            cli.main(verbose_argv)
        assert isinstance(e.value.__cause__, FileNotFoundError)


# --- generate's printer ---------------------------------------------------------------------------
def _ro(rid, texts, finished):
    return RequestOutput(rid, None, [1], None, [
        CompletionOutput(j, t, list(range(len(t))), None, None, "length" if finished else None)
        for j, t in enumerate(texts)], finished)


def test_printer_streams_the_head_and_keeps_order():
    out = io.StringIO()
    p = OrderedPrinter(["A", "B"], 2, holdback=0, echo=True, out=out)
    p.update(1, _ro("1", ["b0", "b1"], False))      # prompt 2 first: buffered
    assert out.getvalue() == "--- prompt 1, completion 1 ---\nA"
    p.update(0, _ro("0", ["a0", "a"], False))
    assert out.getvalue().endswith("Aa0")
    p.update(0, _ro("0", ["a0!", "a1"], True))
    p.update(1, _ro("1", ["b0.", "b1."], True))
    assert out.getvalue() == (
        "--- prompt 1, completion 1 ---\nAa0!\n\n--- prompt 1, completion 2 ---\nAa1\n\n"
        "--- prompt 2, completion 1 ---\nBb0.\n\n--- prompt 2, completion 2 ---\nBb1.\n")


def test_printer_single_prompt_has_no_header_and_no_echo():
    out = io.StringIO()
    p = OrderedPrinter(["A"], 1, holdback=0, echo=False, out=out)
    p.update(0, _ro("0", ["xy"], True))
    assert out.getvalue() == "xy\n"


# --- bench ----------------------------------------------------------------------------------------
def test_synthetic_workload_lengths_and_ids():
    reqs = synthetic(50, 20, 10, 0.0, 0.0, vocab_size=100, avoid_ids=[0, 1, 2], seed=0)
    assert all(len(r.prompt["prompt_token_ids"]) == 20 and r.max_tokens == 10 for r in reqs)
    ids = {t for r in reqs for t in r.prompt["prompt_token_ids"]}
    assert ids <= set(range(3, 100))
    spread = synthetic(400, 20, 10, 0.5, 0.5, 100, [], seed=1)
    lens = sorted(len(r.prompt["prompt_token_ids"]) for r in spread)
    assert lens[0] < 20 < lens[-1] and 15 <= lens[200] <= 25   # median about 20
    assert synthetic(5, 8, 4, 0.3, 0.3, 100, [], seed=2) == synthetic(5, 8, 4, 0.3, 0.3, 100, [], seed=2)


def test_poisson_arrivals():
    reqs = synthetic(2000, 4, 4, 0, 0, 50, [], 0)
    assign_arrivals(reqs, 100.0, 0)
    times = [r.arrival for r in reqs]
    assert times[0] == 0 and times == sorted(times)
    assert 15 < times[-1] < 25  # 2000 requests at 100/s
    inf = synthetic(3, 4, 4, 0, 0, 50, [], 0)
    assign_arrivals(inf, math.inf, 0)
    assert [r.arrival for r in inf] == [0, 0, 0]


def test_workload_file(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt": "hi", "max_tokens": 3}\n\n{"prompt": [5, 6]}\n')
    reqs = from_file(str(f), 7)
    assert [(r.prompt, r.max_tokens) for r in reqs] == [("hi", 3), ({"prompt_token_ids": [5, 6]}, 7)]
    f.write_text('{"prompt": "hi", "max_tokens": 0}\n')
    with pytest.raises(UsageError, match="w.jsonl:1"):
        from_file(str(f), 7)
    with pytest.raises(UsageError, match="cannot read"):
        from_file(str(tmp_path / "none.jsonl"), 7)


def test_percentiles_and_summary():
    p = percentiles([1, 2, 3, 4, 100], scale=1000)
    assert p["p50"] == 3000 and p["mean"] == 22000 and 4000 < p["p90"] <= 100000
    outs = [RequestOutput(str(i), None, [1, 2, 3], None,
                          [CompletionOutput(0, "", [7] * 5, None, None, "length")], True,
                          {"arrival_time": 0.0, "first_token_time": 0.1 * (i + 1),
                           "finish_time": 1.0 + i}) for i in range(2)]
    r = summarize(outs, 2.0, [(0.5, 0.9), (0.25, 0.8)],
                  {"num_blocks": 10, "peak_used_blocks": 6, "num_preemptions": 1,
                   "prefix_cache_queries": 6, "prefix_cache_hits": 3})
    assert (r["num_requests"], r["prompt_tokens"], r["output_tokens"]) == (2, 6, 10)
    assert r["output_tokens_per_s"] == 5.0 and r["ttft_ms"]["p50"] == pytest.approx(150)
    assert r["tpot_ms"]["mean"] == pytest.approx(1000 * ((0.9 / 4) + (1.8 / 4)) / 2)
    assert r["kv_cache_usage"] == {"mean": 0.375, "peak": 0.6}
    assert r["prefix_cache_hit_rate"] == 0.5 and r["num_preemptions"] == 1
    text = format_results(r)
    assert "TTFT" in text and "37.5%" in text and "preemptions" in text
    json.dumps(r)


# --- monitor --------------------------------------------------------------------------------------
METRICS = {
    "pagedllm:kv_cache_usage_perc": 0.25, "pagedllm:kv_cache_used_blocks": 4.0,
    "pagedllm:kv_cache_num_blocks": 16.0, "pagedllm:num_requests_running": 3.0,
    "pagedllm:num_requests_waiting": 1.0, "pagedllm:generation_tokens_total": 100.0,
    "pagedllm:prefix_cache_queries_total": 50.0, "pagedllm:prefix_cache_hits_total": 10.0,
    "pagedllm:time_to_first_token_seconds_sum": 0.3,
    "pagedllm:time_to_first_token_seconds_count": 3.0,
    'pagedllm:request_success_total{finished_reason=length}': 2.0,
}


def test_monitor_views():
    views = monitor.resolve_metrics(["cache_usage,running", "prefix_hits", "gen_throughput",
                                     "ttft", "requests", "num_requests_waiting"])
    prev = (10.0, {**METRICS, "pagedllm:generation_tokens_total": 40.0})
    lines = monitor.render("http://x", views, (12.0, METRICS), prev)
    body = "\n".join(lines[1:])
    assert "[########......................]  25.0%  (4/16 blocks)" in body  # 30 * 0.25 -> 8
    assert any(l.split() == ["requests", "running", "3"] for l in lines)
    assert "20.0% (10/50 tokens)" in body
    assert "30.0/s" in body            # (100 - 40) tokens over 2 s
    assert "100.0 ms" in body          # mean TTFT
    assert "length 2" in body
    assert lines[-1].split()[-1] == "1"  # raw metric by name
    first = monitor.render("http://x", views, (12.0, METRICS), None)
    assert "  -" in "\n".join(first)   # rates need two snapshots


def test_monitor_unknown_metric_is_named():
    (view,) = monitor.resolve_metrics(["no_such_thing"])
    with pytest.raises(CliError, match="no_such_thing"):
        view[1]((0.0, METRICS), None)


def test_config_replace_rederives_defaults():
    base = EngineConfig()
    assert base.replace(max_num_seqs=4096).max_num_batched_tokens == 4096  # was the default
    pinned = EngineConfig(max_num_batched_tokens=3000)
    with pytest.raises(ValueError, match="max_num_batched_tokens must be"):
        pinned.replace(max_num_seqs=4096)  # set by the user: kept, and now too small
    assert pinned.replace(max_num_seqs=8).max_num_batched_tokens == 3000


def test_cuda_without_a_gpu_is_one_line_naming_the_flag(capsys):
    from pagedllm import ops

    if ops.cuda_available():
        pytest.skip("a GPU is visible")
    code, _, err = run_cli(capsys, "generate", "x", "--device", "cuda")
    assert code == 2 and err.count("\n") == 1 and "--device" in err and "unexpected" not in err


def test_length_fix_names_only_limits_that_can_be_raised():
    # It advised "--max-model-len / --kv-cache-memory" whatever set the limit: the model's
    # own positions cannot be raised, and --kv-cache-memory does nothing under --num-kv-blocks.
    from types import SimpleNamespace

    from pagedllm.commands.common import length_fix

    def engine(max_len, max_model_len=None, num_kv_blocks=None):
        return SimpleNamespace(max_model_len=max_len,
                               model_config=SimpleNamespace(max_position_embeddings=1024),
                               config=SimpleNamespace(max_model_len=max_model_len,
                                                      num_kv_blocks=num_kv_blocks))
    assert length_fix(engine(1024), "lower --max-tokens") == (
        "lower --max-tokens: the model's 1024 positions are the limit")
    assert length_fix(engine(512, max_model_len=512), "x") == "x, or raise --max-model-len"
    assert length_fix(engine(320, num_kv_blocks=20), "x") == "x, or raise --num-kv-blocks"
    assert length_fix(engine(320), "x") == "x, or raise --kv-cache-memory"
