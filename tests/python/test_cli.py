"""The CLI end to end on a tiny random-weight Llama: generate, bench, info, serve, and monitor
against a live server."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from pagedllm import cli
from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.sampling_params import SamplingParams
from server_fixtures import ScriptedEngine, ServerThread, write_tiny_model

PYTHON_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "python")
ENGINE = ["--num-threads", "1", "--num-kv-blocks", "64"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"))


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def greedy_texts(model, prompts, max_tokens, n=1, **params):
    engine = LLMEngine(EngineConfig(model=model, num_threads=1, num_kv_blocks=64))
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=max_tokens, temperature=0, n=n,
                                                     **params))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[int(out.request_id)] = [c.text for c in out.outputs]
    return [done[i] for i in range(len(prompts))]


def test_generate_streams_prompt_and_completion(capsys, model):
    code, out, err = run_cli(capsys, "generate", "--model", model, *ENGINE, "--max-tokens", 12,
                             "the quick brown")
    assert code == 0, err
    (expected,) = greedy_texts(model, ["the quick brown"], 12)
    assert out == "the quick brown" + expected[0] + "\n"
    assert re.search(r"\d+ tokens generated for 1 prompt \(4 prompt tokens\) in [\d.]+ s: "
                     r"[\d.]+ tokens/s", err)
    assert "KV cache: 64 blocks of 16 tokens" in err and "preemptions" in err


def test_generate_many_prompts_in_order_from_file(capsys, model, tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "hello world"}\n{"prompt": "once upon"}\n')
    code, out, err = run_cli(capsys, "generate", "--model", model, *ENGINE, "--max-tokens", 6,
                             "--file", f, "--no-echo", "--quiet", "the lazy dog")
    assert code == 0, err and err == ""
    texts = greedy_texts(model, ["the lazy dog", "hello world", "once upon"], 6)
    assert out == "".join(f"{'' if i == 0 else chr(10)}--- prompt {i + 1} ---\n{t[0]}\n"
                          for i, t in enumerate(texts))


def test_generate_with_config_file_and_stop(capsys, model, tmp_path):
    (full,) = greedy_texts(model, ["hello there"], 30)
    stop = next(full[0][i:i + 2] for i in range(3, 25)
                if full[0][i:i + 2].isprintable() and full[0].find(full[0][i:i + 2]) == i)
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(f"model: {model}\nkv_cache:\n  num_blocks: 32\n  block_size: 8\n"
                   "runtime:\n  num_threads: 1\n")
    code, out, err = run_cli(capsys, "generate", "--config", cfg, "--max-tokens", 30,
                             "--stop", stop, "--no-echo", "hello there")
    assert code == 0, err
    assert out == full[0][:full[0].index(stop)] + "\n"
    assert "KV cache: 32 blocks of 8 tokens" in err


@pytest.mark.parametrize("argv,match,code", [
    (["--model", "/nonexistent/dir"], "model directory '/nonexistent/dir' not found", 1),
    (["--kv-cache-memory", "1KiB"], "--kv-cache-memory", 1),
    (["--max-model-len", "100000"], "max_model_len=100000 exceeds", 1),
    (["--num-kv-blocks", "64", "--max-tokens", "5000"], "prompt 1: prompt (3 tokens) + "
     "max_tokens (5000) = 5003 exceeds max_model_len (1024) (lower --max-tokens", 2),
    (["--num-kv-blocks", "64", "--temperature", "-1"], "--temperature must be", 2),
])
def test_generate_errors_are_one_line(capsys, model, argv, match, code):
    argv = ["--model", model, *argv] if argv[0] != "--model" else argv
    got, out, err = run_cli(capsys, "generate", "--num-threads", "1", *argv, "hi")
    assert got == code and out == ""
    (line,) = err.strip().splitlines()[-1:]
    assert line.startswith("pagedllm: error: ") and match in line, err
    assert "Traceback" not in err


def test_bench_synthetic_and_json(capsys, model, tmp_path):
    out_json = tmp_path / "bench.json"
    code, out, err = run_cli(capsys, "bench", "--model", model, *ENGINE, "--num-prompts", 6,
                             "--input-len", 12, "--output-len", 5, "--output-len-spread", 0.3,
                             "--request-rate", 200, "--json", out_json, "--no-progress")
    assert code == 0, err
    for label in ("throughput", "TTFT", "TPOT", "latency", "KV cache usage", "preemptions"):
        assert label in out
    r = json.loads(out_json.read_text())
    assert r["num_requests"] == 6 and r["prompt_tokens"] == 6 * 12
    assert r["output_tokens"] > 0 and r["output_tokens_per_s"] > 0
    assert 0 < r["kv_cache_usage"]["mean"] <= r["kv_cache_usage"]["peak"] <= 1
    assert r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"]
    assert r["workload"]["request_rate"] == 200 and r["engine"]["num_kv_blocks"] == 64


def test_bench_file_workload_with_preemption(capsys, model, tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"story {i} " * 6, "max_tokens": 20}) + "\n"
                         for i in range(8)))
    code, out, err = run_cli(capsys, "bench", "--model", model, "--num-threads", 1,
                             "--num-kv-blocks", 8, "--block-size", 8, "--file", f,
                             "--json", tmp_path / "r.json")
    assert code == 0, err
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["num_requests"] == 8 and r["output_tokens"] == 8 * 20
    assert r["num_preemptions"] > 0 and r["kv_cache_usage"]["peak"] == 1.0


def test_info(capsys, tmp_path):
    code, out, err = run_cli(capsys, "info")
    assert code == 0 and "pagedllm 0." in out and "CUDA" in out and "CPU features" in out
    from pagedllm import _core

    assert f"compiled, {_core.cpu_kernel()} in use" in out
    code, out, _ = run_cli(capsys, "info", "--json")
    facts = json.loads(out)
    assert isinstance(facts["build"]["cuda_compiled"], bool) and facts["cpu"]["cores"] >= 1
    cfg = tmp_path / "e.yaml"
    cfg.write_text("kv_cache:\n  block_size: 32\n")
    code, out, _ = run_cli(capsys, "info", "--config", cfg)
    assert code == 0 and re.search(r"block_size\s+32", out)


def test_python_dash_m_runs_the_cli():
    env = {**os.environ, "PYTHONPATH": PYTHON_DIR}
    r = subprocess.run([sys.executable, "-m", "pagedllm", "--version"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("pagedllm ")
    r = subprocess.run([sys.executable, "-m", "pagedllm", "generate", "--bogus"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("pagedllm: error: unrecognized arguments")


def test_serve_process_answers_and_stops_on_ctrl_c(model, capsys):
    env = {**os.environ, "PYTHONPATH": PYTHON_DIR, "PAGEDLLM_API_KEY": "k"}
    proc = subprocess.Popen([sys.executable, "-m", "pagedllm", "serve", "--model", model,
                             "--port", "0", *ENGINE, "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        m = re.search(r"serving 'tiny\w*' on (http://127\.0\.0\.1:\d+) .*an API key", line)
        assert m, line
        import httpx

        url = m.group(1)
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3},
                       headers={"Authorization": "Bearer k"}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        code, out, err = run_cli(capsys, "monitor", "--url", url, "--once",
                                 "--metric", "cache_usage,running,requests")
        assert code == 0, err
        assert "KV cache usage" in out and "0.0%" in out and "length 1" in out
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0


def test_monitor_against_a_busy_server(capsys):
    # A scripted engine (one token per 20 ms step) keeps the request running for seconds
    # whatever the machine's speed; the real engine is watched in the serve test above.
    from pagedllm.server import create_app

    engine = ScriptedEngine(num_blocks=64, step_delay=0.02)
    with ServerThread(create_app(engine)) as s:
        import httpx

        with httpx.Client(base_url=s.url, timeout=60) as c, c.stream(
                "POST", "/v1/completions",
                json={"prompt": "hello", "max_tokens": 400, "stream": True}) as r:
            next(r.iter_lines())  # the request is running now
            code, out, err = run_cli(capsys, "monitor", "--url", s.url, "--once",
                                     "--metric", "running", "--metric", "cache_usage")
            assert code == 0, err
            running = next(line for line in out.splitlines() if "requests running" in line)
            assert running.split()[-1] == "1"
            used = int(re.search(r"\((\d+)/64 blocks\)", out).group(1))
            assert 2 <= used <= 63  # the 6-token prompt and the tokens so far, 4 per block
            code, out, err = run_cli(capsys, "monitor", "--url", s.url, "--count", 2,
                                     "--interval", 0.05, "--metric", "gen_throughput")
            assert code == 0 and out.count("pagedllm monitor:") == 2  # not a TTY: one each
            assert re.search(r"generation\s+[\d.]+/s", out)  # a rate from two snapshots
    code, _, err = run_cli(capsys, "monitor", "--url", s.url, "--once")
    assert code == 1 and "cannot reach" in err
