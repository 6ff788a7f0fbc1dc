"""The CLI end to end on the bundled default model (no --model): generate, bench, info, serve,
and monitor against a live server."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

import pagedllm
from pagedllm import cli
from pagedllm.config import EngineConfig
from pagedllm.default_model import default_model_path
from pagedllm.engine.llm_engine import LLMEngine
from server_fixtures import ScriptedEngine, ServerThread

# Subprocesses must import the same pagedllm as this test (an installed wheel in CI, the
# source tree with an in-place _core in development).
PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pagedllm.__file__)))
ENGINE = ["--num-threads", "1", "--num-kv-blocks", "64"]


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def reference_texts(prompts, seed=0, **params):
    """What the engine alone writes for the prompts on the bundled model, completions in order.

    Unset sampling fields take the checkpoint's generation_config.json, as the CLI does.
    """
    engine = LLMEngine(EngineConfig(num_threads=1, num_kv_blocks=64, seed=seed,
                                    model=default_model_path()))
    sp = engine.default_sampling_params(**params)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, sp)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[int(out.request_id)] = [c.text for c in out.outputs]
    return [done[i] for i in range(len(prompts))]


def test_generate_streams_prompt_and_completion(capsys):
    code, out, err = run_cli(capsys, "generate", *ENGINE, "--temperature", 0, "--max-tokens", 12,
                             "The list type")
    assert code == 0, err
    (expected,) = reference_texts(["The list type"], temperature=0, max_tokens=12)
    assert out == "The list type" + expected[0] + "\n"
    assert re.search(r"12 tokens generated for 1 prompt \(\d+ prompt tokens\) in [\d.]+ s: "
                     r"[\d.]+ tokens/s, first token after \d+ ms", err)
    assert "KV cache: 64 blocks of 16 tokens" in err and "0 preemptions" in err


def test_generate_samples_with_the_checkpoint_defaults(capsys):
    # No sampling flags: generation_config.json's temperature 0.8 / top_p 0.95, engine seed 3.
    code, out, err = run_cli(capsys, "generate", *ENGINE, "--seed", 3, "--max-tokens", 16,
                             "--no-echo", "--quiet", "A dictionary")
    assert code == 0, err
    (sampled,) = reference_texts(["A dictionary"], seed=3, max_tokens=16)
    (greedy,) = reference_texts(["A dictionary"], seed=3, max_tokens=16, temperature=0)
    assert out == sampled[0] + "\n" and sampled != greedy


def test_generate_many_prompts_in_order_from_file(capsys, tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "The for statement"}\n{"prompt": "An exception"}\n')
    code, out, err = run_cli(capsys, "generate", *ENGINE, "--temperature", 0, "--max-tokens", 6,
                             "-n", 2, "--file", f, "--no-echo", "--quiet", "A module")
    assert code == 0, err
    assert err == ""
    texts = reference_texts(["A module", "The for statement", "An exception"], n=2,
                            temperature=0, max_tokens=6)
    expected = "\n".join(f"--- prompt {i + 1}, completion {j + 1} ---\n{t[j]}\n"
                         for i, t in enumerate(texts) for j in range(2))
    assert out == expected


def test_generate_with_config_file_and_stop(capsys, tmp_path):
    (full,) = reference_texts(["The list type"], temperature=0, max_tokens=30)
    text = full[0]
    stop = next(text[i:i + 3] for i in range(4, 25) if text.find(text[i:i + 3]) == i)
    cfg = tmp_path / "engine.yaml"
    cfg.write_text("kv_cache:\n  num_blocks: 32\n  block_size: 8\nruntime:\n  num_threads: 1\n")
    code, out, err = run_cli(capsys, "generate", "--config", cfg, "--temperature", 0,
                             "--max-tokens", 30, "--stop", stop, "--no-echo", "The list type")
    assert code == 0, err
    assert out == text[:text.index(stop)] + "\n"
    assert "KV cache: 32 blocks of 8 tokens" in err


@pytest.mark.parametrize("argv,match,code", [
    # Options that can never make an engine are usage errors (2), as USAGE.md says.
    (["--model", "/nonexistent/dir"], "model directory '/nonexistent/dir' not found", 2),
    # one token's K/V take 4 KiB: no block size fits 1 KiB, a 4-token block fits 16 KiB
    (["--kv-cache-memory", "1KiB"], r"holds no block at all; raise kv_cache_memory_bytes to at "
                                    r"least 65536 \(one block\) \(flags: --kv-cache-memory\)$", 2),
    (["--kv-cache-memory", "16KiB"], r"\(one block\), or lower block_size \(to 4 or less\) "
                                     r"\(flags: --block-size, --kv-cache-memory\)$", 2),
    (["--max-model-len", "100000"], "max_model_len=100000 exceeds", 2),
    (["--dtype", "float16"], "float16", 2),
    (["--num-kv-blocks", "64", "--max-model-len", "512", "--max-tokens", "5000"],
     r"prompt 1: prompt \(\d+ tokens\) \+ max_tokens \(5000\) = \d+ exceeds max_model_len "
     r"\(512\), the maximum context length \(lower --max-tokens, or raise --max-model-len\)$",
     2),
    # the model's own limit: no flag raises it (--max-model-len 2048 would be refused)
    (["--max-tokens", "5000"], r"exceeds max_model_len \(1024\), the maximum context length "
     r"\(lower --max-tokens: the model's 1024 positions are the limit\)$", 2),
    (["--num-kv-blocks", "64", "--temperature", "-1"], "--temperature must be", 2),
])
def test_generate_errors_are_one_line(capsys, argv, match, code):
    got, out, err = run_cli(capsys, "generate", "--num-threads", "1", *argv, "hi")
    assert got == code and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("pagedllm: error: ") and re.search(match, line), err
    assert "Traceback" not in err


def test_bench_synthetic_and_json(capsys, tmp_path):
    out_json = tmp_path / "bench.json"
    code, out, err = run_cli(capsys, "bench", *ENGINE, "--num-prompts", 6,
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
    assert r["engine"]["model"] == default_model_path()


def test_bench_file_workload_with_preemption(capsys, tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"The function number {i} returns",
                                     "max_tokens": 20}) + "\n" for i in range(8)))
    code, out, err = run_cli(capsys, "bench", "--num-threads", 1, "--num-kv-blocks", 8,
                             "--block-size", 8, "--file", f, "--json", tmp_path / "r.json")
    assert code == 0, err
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["num_requests"] == 8 and r["output_tokens"] == 8 * 20
    assert r["num_preemptions"] > 0 and r["kv_cache_usage"]["peak"] == 1.0


def test_info(capsys, tmp_path):
    from pagedllm import _core

    code, out, err = run_cli(capsys, "info")
    assert code == 0 and "pagedllm 0." in out and "CUDA" in out and "CPU features" in out
    assert f"compiled, {_core.cpu_kernel()} in use" in out
    assert f"default model   {default_model_path()}" in out
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


def test_serve_process_answers_and_stops_on_ctrl_c(capsys):
    env = {**os.environ, "PYTHONPATH": PYTHON_DIR, "PAGEDLLM_API_KEY": "k"}
    proc = subprocess.Popen([sys.executable, "-m", "pagedllm", "serve", "--port", "0", *ENGINE,
                             "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        m = re.search(r"serving 'default_model' on (http://127\.0\.0\.1:\d+) .*an API key", line)
        assert m, line
        import httpx

        url = m.group(1)
        r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": "Bearer k"},
                       json={"messages": [{"role": "user", "content": "What is a list?"}],
                             "max_tokens": 8}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        # /metrics is behind the API key: the monitor sends it.
        code, out, err = run_cli(capsys, "monitor", "--url", url, "--once")
        assert code == 1 and "--api-key" in err
        code, out, err = run_cli(capsys, "monitor", "--url", url, "--once", "--api-key", "k",
                                 "--metric", "cache_usage,running,requests")
        assert code == 0, err
        assert "KV cache usage" in out and "0.0%" in out
        assert re.search(r"requests finished\s+(length|stop) 1", out)
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
            # Keep the line iterator referenced: a dropped one closes the connection (httpcore
            # closes its stream on GeneratorExit) and the server then aborts the request.
            lines = r.iter_lines()
            next(lines)  # the request is running now
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


@pytest.mark.parametrize("argv,match", [(["--request-rate", "0"], "--request-rate must be > 0"),
                                        (["--input-len-spread", "-1"], "--input-len-spread must be")])
def test_bench_flags_are_checked_before_the_model_loads(capsys, tmp_path, argv, match):
    # A model directory that does not exist: the flag error must come first.
    code, out, err = run_cli(capsys, "bench", "--model", tmp_path / "missing", *argv)
    assert code == 2 and re.search(match, err), err
