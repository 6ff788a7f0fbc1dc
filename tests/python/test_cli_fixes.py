"""Fixes of the command line found by an audit: --stop escapes, output paths checked before the
model loads, bench's workload checks, lazy imports (fast --help, an early Ctrl-C is an
interrupt), the end of an interrupted run, monitor's flags, config hints and merges, the
persistence flags, and --file encodings.

Most checks fail before a model loads (a missing --model directory proves it: its error would
come first otherwise); the others run the bundled default model with a few tokens."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import pagedllm
from pagedllm import cli
from pagedllm.commands import HELPS, generate
from pagedllm.commands.bench_workload import from_file
from pagedllm.commands.common import UsageError, end_run, engine_config, flag_hint
from pagedllm.commands.stats_file import StatsFileWriter

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pagedllm.__file__)))
ENV = {**os.environ, "PYTHONPATH": PYTHON_DIR}
ENGINE = ["--num-threads", "1", "--num-kv-blocks", "64"]


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagedllm: error: "), err
    assert "Traceback" not in err
    return lines[0]


def missing_model(tmp_path):
    return ["--model", str(tmp_path / "missing-model")]


def engine_args(*argv):
    return cli.build_parser().parse_args(["generate", "p", *argv])


# --- 1: --stop escapes ----------------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [
    ("é\\n", "é\n"), ("世界\\r\\n", "世界\r\n"), ("a\\tb", "a\tb"), ("\\\\d", "\\d"),
    ("\\x41\\u00e9\\U0001F642", "Aé🙂"), ("\\\"q\\'", "\"q'"), ("plain é", "plain é"),
    ("\\n\\n", "\n\n")])
def test_stop_escapes_keep_other_characters(text, value):
    assert generate.unescape_stop(text) == value


@pytest.mark.parametrize("stop,match", [
    ("\\x", r"--stop '\\x': '\\x' takes 2 hex digits"),
    ("a\\", r"--stop 'a\\': a trailing backslash"),
    ("\\q", r"an unknown escape '\\q'"),
    ("\\u12", r"'\\u' takes 4 hex digits, got '\\u12'"),
    ("\\ud800", r"'\\ud800' is not a Unicode character"),
])
def test_bad_stop_escapes_are_usage_errors(capsys, tmp_path, stop, match):
    code, out, err = run_cli(capsys, "generate", *missing_model(tmp_path), "--stop", stop, "hi")
    line = one_line(err)
    assert code == 2 and out == "" and re.search(match, line), line
    assert "write \\\\ for a backslash" in line


# --- 2, 3: output files checked before the model loads, no FILE.tmp left ------------------------
def test_stats_file_that_is_a_directory(capsys, tmp_path):
    target = tmp_path / "dir"
    target.mkdir()
    code, _, err = run_cli(capsys, "generate", *missing_model(tmp_path), "--stats-file", target,
                           "hi")
    line = one_line(err)
    assert code == 2 and "is a directory" in line and "--stats-file" in line, line
    assert sorted(os.listdir(tmp_path)) == ["dir"]  # no dir.tmp beside it
    code, _, err = run_cli(capsys, "bench", *missing_model(tmp_path), "--stats-file",
                           tmp_path / "no" / "x.prom")
    line = one_line(err)
    assert code == 2 and "does not exist (fix --stats-file)" in line, line


def test_stats_file_write_leaves_no_tmp_when_it_fails(tmp_path, monkeypatch):
    class Engine:
        num_prompt_tokens = num_generation_tokens = num_steps = 0

        def kv_cache_stats(self):
            return {}

    path = tmp_path / "s.prom"
    writer = StatsFileWriter(Engine(), str(path), "m")
    assert path.exists()

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        writer.write()
    assert sorted(os.listdir(tmp_path)) == ["s.prom"]
    with pytest.raises(ValueError, match="is a directory"):
        StatsFileWriter(Engine(), str(tmp_path), "m")


def test_bench_json_path_is_checked_before_the_model_loads(capsys, tmp_path):
    code, out, err = run_cli(capsys, "bench", *missing_model(tmp_path), "--json",
                             "/nonexistent/dir/out.json")
    line = one_line(err)
    assert code == 2 and out == "" and "--json '/nonexistent/dir/out.json'" in line
    assert line.endswith("(fix --json)")
    code, _, err = run_cli(capsys, "bench", *missing_model(tmp_path), "--json", tmp_path)
    assert code == 2 and "is a directory" in one_line(err)


# --- 4: bench's workload flags and file -----------------------------------------------------------
@pytest.mark.parametrize("argv,match", [
    (["--input-len-spread", "nan"], "--input-len-spread must be a finite number >= 0, got nan"),
    (["--output-len-spread", "inf"], "--output-len-spread must be a finite number >= 0"),
    (["--request-rate", "nan"], "--request-rate must be > 0"),
    (["--temperature", "-1"], "--temperature must be"),
    (["--temperature", "nan"], "--temperature must be"),
])
def test_bench_flags_fail_before_the_model_loads(capsys, tmp_path, argv, match):
    code, _, err = run_cli(capsys, "bench", *missing_model(tmp_path), *argv)
    line = one_line(err)
    assert code == 2 and re.search(match, line), line


@pytest.mark.parametrize("line,match", [
    ('{"prompt": "hi", "max_tokens": true}', '"max_tokens" must be an integer >= 1, got true'),
    ('{"prompt": "hi", "max_tokens": 2.0}', '"max_tokens" must be an integer >= 1, got 2.0'),
    ('{"prompt": [1, true]}', '"prompt" must be'),
    ('{"prompt": [1, -5]}', '"prompt" must be'),
    ('{"prompt": {"prompt_token_ids": "abc"}}',
     '"prompt" must be .* got {"prompt_token_ids": "abc"}'),
    ('{"prompt_token_ids": "abc"}', '"prompt_token_ids" must be a non-empty list .* got "abc"'),
    ('[1, 2]', "expected a JSON object"),
])
def test_bench_file_lines_are_checked_before_the_model_loads(capsys, tmp_path, line, match):
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt": "ok"}\n\n' + line + "\n")
    code, _, err = run_cli(capsys, "bench", *missing_model(tmp_path), "--file", f)
    msg = one_line(err)
    assert code == 2 and f"{f}:3: " in msg and re.search(match, msg), msg
    assert msg.endswith("(fix that line of --file)") and "--input-len" not in msg


def test_bench_file_token_ids_and_nested_form(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt": {"prompt_token_ids": [5, 6]}, "max_tokens": 2}\n{"prompt": [7]}\n'
                 '{"prompt_token_ids": [8, 9], "max_tokens": 3}\n')  # vLLM's form, as USAGE says
    reqs = from_file(str(f), 9)
    assert [(r.prompt, r.max_tokens, r.line) for r in reqs] == [
        ({"prompt_token_ids": [5, 6]}, 2, 1), ({"prompt_token_ids": [7]}, 9, 2),
        ({"prompt_token_ids": [8, 9]}, 3, 3)]
    for line, match in (('{"prompt_token_ids": "hi"}', r'"prompt_token_ids" must be .* got "hi"'),
                        ('{"prompt": "a", "prompt_token_ids": [1]}', "expected one of them")):
        f.write_text(line + "\n")
        with pytest.raises(UsageError, match=match):
            from_file(str(f), 9)


def test_bench_file_request_the_engine_refuses_names_the_line(capsys, tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt": "hi", "max_tokens": 2}\n{"prompt": [1, 99999], "max_tokens": 2}\n')
    code, out, err = run_cli(capsys, "bench", *ENGINE, "--file", f, "--no-progress")
    msg = one_line(err)
    assert code == 2 and f"{f}:2: prompt token id 99999 is outside the vocabulary" in msg, msg
    assert msg.endswith("(fix that line of --file)") and "--input-len" not in msg
    f.write_text('{"prompt": [1, 2, 3], "max_tokens": 5000}\n')
    code, out, err = run_cli(capsys, "bench", *ENGINE, "--file", f, "--no-progress")
    msg = one_line(err)
    assert code == 2 and f"{f}:1: " in msg and "max_model_len" in msg, msg
    # the model's positions are the limit: no flag can raise it (it advised --max-model-len)
    assert msg.endswith("(shorten that request: the model's 1024 positions are the limit)")
    assert "--input-len" not in msg


# --- 5: lazy imports: fast --help, early Ctrl-C ---------------------------------------------------
def test_help_imports_no_command_nor_torch():
    code = ("import sys\nfrom pagedllm.cli import main\n"
            "for argv in (['--help'], ['--version'], ['monitor', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "heavy = [m for m in ('torch', 'numpy', 'pagedllm.config',"
            " 'pagedllm.commands.generate') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout, r.stdout
    for name, help_text in HELPS.items():
        assert re.search(rf"{name}\s+{re.escape(help_text[:30])}", r.stdout)


def test_every_command_module_matches_the_help_table():
    from pagedllm.commands import load

    for name, help_text in HELPS.items():
        module = load(name)
        assert (module.NAME, module.HELP) == (name, help_text)
        assert callable(module.add_arguments) and callable(module.run)


def test_entry_point_target_exists():
    pyproject = os.path.join(PYTHON_DIR, os.pardir, "pyproject.toml")
    if not os.path.exists(pyproject):
        pytest.skip("not a source tree")
    with open(pyproject, encoding="utf-8") as f:
        assert 'pagedllm = "pagedllm.cli:main"' in f.read()
    assert callable(cli.main)


def test_command_of():
    assert cli.command_of(["-v", "generate", "x"]) == "generate"
    assert cli.command_of(["--verbose", "--", "bench"]) == "bench"
    assert cli.command_of(["--help"]) is None and cli.command_of(["nope"]) is None


def _sigint_after(delay, argv):
    proc = subprocess.Popen([sys.executable, "-m", "pagedllm", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_early_ctrl_c_is_one_line_and_130():
    # 0.4 s in, the command is still importing its modules (torch takes seconds).
    code, out, err = _sigint_after(0.4, ["generate", *ENGINE, "--max-tokens", "2", "hi"])
    assert code == 130 and err == "pagedllm: interrupted\n", err


def _swallowed_ctrl_c():
    """A Ctrl-C that lands in code swallowing the KeyboardInterrupt (as some imports do)."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here
    except BaseException:  # noqa: BLE001 - what such code does
        pass


def test_ctrl_c_during_the_imports_is_never_lost(capsys, monkeypatch):
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")
    real_load = cli.load
    ran = []

    def load(name):
        _swallowed_ctrl_c()
        module = real_load(name)
        monkeypatch.setattr(module, "run", lambda args: ran.append(args) or 0)
        return module

    monkeypatch.setattr(cli, "load", load)
    code, out, err = run_cli(capsys, "monitor", "--once")
    assert (code, out, err, ran) == (130, "", "pagedllm: interrupted\n", [])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_ctrl_c_swallowed_while_running_still_ends_in_130(capsys, monkeypatch):
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")
    from pagedllm.commands import monitor

    monkeypatch.setattr(monitor, "run", lambda args: _swallowed_ctrl_c() or 0)
    code, out, err = run_cli(capsys, "monitor", "--once")
    assert (code, err) == (130, "pagedllm: interrupted\n")


# --- 6: an interrupted generate writes its trace and stats file -----------------------------------
def test_interrupted_generate_writes_the_trace_and_the_stats_file(tmp_path):
    trace, stats = tmp_path / "t.json", tmp_path / "s.prom"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedllm", "generate", *ENGINE, "--max-tokens", "1000",
         "--ignore-eos", "--temperature", "0", "-n", "2", "--profile-trace", trace,
         "--stats-file", stats, "The list type", "A dictionary", "An exception"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not stats.exists() and time.monotonic() < deadline:  # written when the run starts
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.endswith(f"trace of the engine's steps written to {trace}\n"
                        "pagedllm: interrupted\n"), err
    from pagedllm.commands.monitor import read_stats_file

    _, samples = read_stats_file(str(stats))
    assert samples["pagedllm:num_requests_running"] == 0
    assert samples["pagedllm:kv_cache_used_blocks"] == 0
    assert samples["pagedllm:request_success_total{finished_reason=abort}"] == 3
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("name") == "step" for e in events)
    assert not (tmp_path / "s.prom.tmp").exists()


def test_end_run_aborts_the_unfinished_requests():
    calls = []

    class Engine:
        def abort_request(self, ids):
            calls.append(("abort", sorted(ids)))

        def stop_trace(self):
            calls.append(("stop_trace",))
            return []

    class Stats:
        def aborted(self, ids):
            calls.append(("aborted", sorted(ids)))

        def write(self):
            calls.append(("write",))

    end_run(Engine(), Stats(), {"b", "a"})
    assert calls == [("abort", ["a", "b"]), ("aborted", ["a", "b"]), ("write",), ("stop_trace",)]


# --- 7: monitor's flags ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv,match", [
    (["--url", "notaurl"],
     r"--url 'notaurl' is not an http\(s\) URL \(expected http\(s\)://host:port"),
    (["--url", "localhost:8000"], r"--url 'localhost:8000' is not an http\(s\) URL"),
    (["--url", "http://h:99999"], r"--url 'http://h:99999' is not a valid URL"),
    (["--count", "-1"], r"--count must be >= 0, got -1 \(0: refresh until Ctrl-C\)"),
    (["--interval", "inf"], "--interval must be a finite number"),
])
def test_monitor_bad_flags_are_usage_errors(capsys, argv, match):
    code, out, err = run_cli(capsys, "monitor", "--once", *argv)
    line = one_line(err)
    assert code == 2 and out == "" and re.search(match, line), line


# --- 8: config error hints ------------------------------------------------------------------------
def test_hint_ignores_lists_of_valid_keys(capsys, tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("sparse_attention: dense\n")
    code, _, err = run_cli(capsys, "info", "--config", cfg)
    line = one_line(err)
    assert code == 2 and "sparse_attention: expected a mapping" in line
    assert line.endswith("(fix the --config file)") and "--seed" not in line, line
    assert flag_hint("x: expected one of ['dense', 'seed'], got 'y'") is None
    assert flag_hint("raise kv_cache_memory_bytes to [1, 2] blocks") == "--kv-cache-memory"
    assert flag_hint("persistenceXmax_bytes") is None  # the '.' of a field is not a wildcard


# --- 9: persistence flags without the tier ------------------------------------------------------
@pytest.mark.parametrize("argv,match", [
    (["--hot-blocks-threshold", "5"], "--hot-blocks-threshold needs --persistence-path"),
    (["--persistence-max-bytes", "1KiB", "--persistence-backend", "file"],
     "--persistence-backend and --persistence-max-bytes need --persistence-path"),
])
def test_persistence_flags_need_the_tier(capsys, tmp_path, argv, match):
    code, _, err = run_cli(capsys, "generate", *missing_model(tmp_path), *argv, "hi")
    line = one_line(err)
    assert code == 2 and match in line, line


def test_persistence_flags_apply_to_a_config_that_enables_it(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"persistence:\n  storage_path: {tmp_path / 'kv'}\n")
    c = engine_config(engine_args("--config", str(cfg), "--hot-blocks-threshold", "3"))
    assert c.persistence.enabled and c.persistence.hot_blocks_threshold == 3
    cfg.write_text(f"persistence:\n  enabled: false\n  storage_path: {tmp_path / 'kv'}\n")
    with pytest.raises(UsageError, match="--hot-blocks-threshold needs --persistence-path"):
        engine_config(engine_args("--config", str(cfg), "--hot-blocks-threshold", "3"))
    c = engine_config(engine_args("--config", str(cfg), "--persistence-path", str(tmp_path / "k")))
    assert c.persistence.enabled


# --- 10: --file encodings -------------------------------------------------------------------------
@pytest.mark.parametrize("command,what", [("generate", "prompt file"), ("bench", "workload file")])
def test_file_that_is_not_utf8(capsys, tmp_path, command, what):
    f = tmp_path / "p.jsonl"
    f.write_bytes(b'{"prompt": "ok"}\n{"prompt": "a\xffb"}\n')
    code, _, err = run_cli(capsys, command, *missing_model(tmp_path), "--file", f)
    line = one_line(err)
    assert code == 2 and f"{what} '{f}' is not UTF-8: byte 0xff on line 2" in line, line
    assert "--file" in line


def test_prompt_file_newlines(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes("first é\r\n\r\nsecond\rthird\n".encode("utf-8"))
    args = engine_args("--file", str(f))
    assert generate.read_prompts(args) == ["p", "first é", "second", "third"]


# --- 11: a --kv-cache-memory flag wins over the file's num_blocks ------------------------------
def test_kv_cache_memory_flag_wins_over_the_files_num_blocks(capsys, tmp_path):
    cfg = tmp_path / "blocks.yaml"
    cfg.write_text("kv_cache:\n  num_blocks: 64\n  memory_bytes: 1048576\n")
    c = engine_config(engine_args("--config", str(cfg), "--kv-cache-memory", "1GiB"))
    assert (c.num_kv_blocks, c.kv_cache_memory_bytes) == (None, 1 << 30)
    c = engine_config(engine_args("--config", str(cfg), "--kv-cache-memory", "1GiB",
                                  "--num-kv-blocks", "32"))
    assert (c.num_kv_blocks, c.kv_cache_memory_bytes) == (32, 1 << 30)
    c = engine_config(engine_args("--config", str(cfg)))
    assert (c.num_kv_blocks, c.kv_cache_memory_bytes) == (64, 1 << 20)  # the file alone
    code, out, err = run_cli(capsys, "info", "--config", cfg, "--kv-cache-memory", "1GiB")
    assert code == 0, err
    assert f"engine config ({cfg} with the flags):" in out
    assert re.search(r"kv_cache_memory_bytes\s+1073741824\n", out)
    assert re.search(r"num_kv_blocks\s+None\n", out)


def test_cross_kv_fraction_flag_wins_over_the_files_cross_blocks(tmp_path):
    cfg = tmp_path / "cross.yaml"
    cfg.write_text("multimodal:\n  num_cross_kv_blocks: 10\n")
    c = engine_config(engine_args("--config", str(cfg), "--cross-kv-fraction", "0.5"))
    assert (c.num_cross_kv_blocks, c.cross_kv_fraction) == (None, 0.5)


def test_info_with_flags_and_no_config(capsys):
    code, out, err = run_cli(capsys, "info", "--block-size", "8")
    assert code == 0, err
    assert "engine config (the flags):" in out and re.search(r"block_size\s+8\n", out)


def test_default_max_tokens_fits_the_context(capsys):
    # The default 64 tokens is fitted to what --max-model-len leaves after the prompt (it was
    # a usage error telling the user to lower a --max-tokens they never gave); a --max-tokens
    # given is still checked.
    argv = ["generate", *ENGINE, "--max-model-len", "24", "--temperature", "0", "--ignore-eos",
            "--quiet", "The list type"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and "Traceback" not in err, err
    code, out, err = run_cli(capsys, *argv[:-1], "--max-tokens", "64", "The list type")
    assert code == 2 and "exceeds max_model_len (24)" in one_line(err)
