"""Fixes of the diagnostics commands found by an audit: generate exits 1 naming the prompts the
engine failed; --profile-trace checked before the model loads as --stats-file; a trace never
stopped still reaches its file (engine collected, interpreter exit); monitor's histograms, its
files without pagedllm figures and its metrics missing at a later refresh; the "error" finish
reason of /metrics documented.

The flag checks fail before a model loads (a missing --model directory proves it: its error
would come first otherwise); the others run the bundled default model with a few tokens."""

from __future__ import annotations

import gc
import http.server
import json
import os
import subprocess
import sys
import threading
import weakref

import pytest

from pagedllm.commands import generate, monitor
from pagedllm.commands.errors import CliError
from pagedllm.outputs import CompletionOutput, RequestOutput
from test_cli_fixes import ENGINE, ENV, missing_model, one_line, run_cli

P = "pagedllm:"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- 1: generate exits 1 when a request failed ----------------------------------------------------
GOOD, BAD = "The list type", "zebra crossing"


@pytest.fixture
def poisoned_generate(monkeypatch):
    """generate's engine with NaN in the embeddings of the tokens only BAD has (a forward hook):
    with --check-numerics fail the engine fails BAD's request and runs the others."""
    real_build = generate.build_engine

    def build(config):
        import torch

        engine = real_build(config)
        tok = engine.tokenizer
        marked = torch.tensor(sorted(set(tok.encode(BAD, add_special_tokens=False))
                                     - set(tok.encode(GOOD))))
        assert len(marked) > 0

        def hook(module, args, output):
            (ids,) = args
            output[torch.isin(ids, marked)] = float("nan")
            return output
        engine.executor.worker.model.embed_tokens.register_forward_hook(hook)
        return engine
    monkeypatch.setattr(generate, "build_engine", build)


def test_generate_prints_every_output_and_exits_1_naming_the_failed_prompt(
        capsys, tmp_path, poisoned_generate):
    stats = tmp_path / "s.prom"
    code, out, err = run_cli(capsys, "generate", *ENGINE, "--check-numerics", "fail",
                             "--temperature", "0", "--max-tokens", "3", "--ignore-eos",
                             "--stats-file", stats, GOOD, BAD, GOOD)
    assert code == 1, err
    # Every prompt is printed, the good ones with their (greedy, equal) completions.
    bodies = [s.split(" ---\n", 1)[1].strip() for s in out.split("--- prompt ")[1:]]
    assert len(bodies) == 3 and bodies[1] == BAD, out
    assert bodies[0] == bodies[2] and bodies[0].startswith(GOOD) and bodies[0] != GOOD, out
    # One line on stderr per failed prompt, naming it and why, last.
    failures = [l for l in err.splitlines() if l.startswith("pagedllm: error: ")]
    assert failures == [err.strip().splitlines()[-1]], err
    assert failures[0].startswith("pagedllm: error: prompt 2 (request generate-1) failed: "
                                  "numeric check: NaN/Inf in the output of the embeddings"), err
    # /metrics' finish reason of a failed request (documented in USAGE.md, see below).
    _, samples = monitor.read_stats_file(str(stats))
    assert samples[P + "request_success_total{finished_reason=error}"] == 1
    assert samples[P + "request_success_total{finished_reason=length}"] == 2


def test_generate_exit_code_0_when_no_request_failed(capsys):
    code, out, err = run_cli(capsys, "generate", *ENGINE, "--check-numerics", "fail",
                             "--max-tokens", "2", "--quiet", GOOD)
    assert code == 0 and err == "" and out.startswith(GOOD), err


def _output(rid: str, finished: bool, comps, error=None) -> RequestOutput:
    return RequestOutput(rid, None, [1], None, comps, finished, error=error)


def test_printer_moves_past_a_failed_request_without_completions(capsys):
    import io

    out = io.StringIO()
    printer = generate.OrderedPrinter(["a", "b"], 2, 0, True, out)
    # The engine failed prompt 1 before any completion existed: none will ever come.
    printer.update(0, _output("r0", True, [], error="the model step failed: boom"))
    comps = [CompletionOutput(j, f" b{j}", [5], None, None, "length") for j in range(2)]
    printer.update(1, _output("r1", True, comps))
    assert out.getvalue() == ("--- prompt 1, completion 1 ---\na\n\n--- prompt 1, completion 2 "
                              "---\na\n\n--- prompt 2, completion 1 ---\nb b0\n\n"
                              "--- prompt 2, completion 2 ---\nb b1\n")


def test_request_failure_and_report_failures(capsys):
    from pagedllm.commands.common import report_failures, request_failure

    ok = _output("a", True, [CompletionOutput(0, "x", [1], None, None, "stop")])
    assert request_failure(ok) is None
    assert request_failure(_output("b", True, [], error="numeric check:\n  NaN")) == \
        "numeric check: NaN"
    silent = _output("c", True, [CompletionOutput(0, "", [], None, None, "error")])
    assert "error" in request_failure(silent)
    assert report_failures({}) == 0 and capsys.readouterr().err == ""
    assert report_failures({"prompt 2": "why", "prompt 5": "because"}) == 1
    assert capsys.readouterr().err == ("pagedllm: error: prompt 2 failed: why\n"
                                       "pagedllm: error: prompt 5 failed: because\n")


# --- 2: --profile-trace checked before the model loads, as --stats-file ---------------------------
def _trace_argv(command, tmp_path, *flags):
    return [command, *missing_model(tmp_path), *flags] + (["hi"] if command == "generate" else [])


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
@pytest.mark.parametrize("value,match", [
    ("{dir}", r"--profile-trace '.*' is a directory \(fix --profile-trace: give a file path\)"),
    ("", r"--profile-trace '' is empty \(fix --profile-trace: give a file path\)"),
    ("{dir}/no/t.json", r"--profile-trace '.*/no/t\.json': directory '.*/no' does not exist "
                        r"\(fix --profile-trace\)"),
])
def test_profile_trace_path_is_a_usage_error_before_the_model_loads(capsys, tmp_path, command,
                                                                     value, match):
    import re

    argv = _trace_argv(command, tmp_path, "--profile-trace", value.format(dir=tmp_path))
    code, out, err = run_cli(capsys, *argv)
    line = one_line(err)
    assert code == 2 and re.search(match, line), line


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
def test_profile_windows_are_checked_before_the_model_loads(capsys, tmp_path, command):
    code, _, err = run_cli(capsys, *_trace_argv(command, tmp_path, "--profile-torch-steps",
                                                "2:4"))
    assert code == 2 and "--profile-torch-steps needs --profile-trace" in one_line(err)
    code, _, err = run_cli(capsys, *_trace_argv(command, tmp_path, "--profile-trace",
                                                tmp_path / "t.json", "--profile-cuda-steps", "x"))
    assert code == 2 and "--profile-cuda-steps='x': expected START:END" in one_line(err)
    assert not (tmp_path / "t.json").exists()


def test_empty_stats_file_path_is_a_usage_error(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", *missing_model(tmp_path), "--stats-file", "", "hi")
    assert code == 2 and "--stats-file '' is empty" in one_line(err)


def test_trace_options_and_writer_refuse_an_empty_path_and_a_directory(tmp_path):
    from pagedllm.engine.trace_options import TraceOptions
    from pagedllm.engine.trace_writer import ChromeTraceWriter

    with pytest.raises(ValueError, match="profile_trace='' is empty: expected a file path"):
        TraceOptions(path="")
    with pytest.raises(ValueError, match="is a directory: expected a file path"):
        ChromeTraceWriter(str(tmp_path), 0)


# --- 3: a trace never stopped reaches its file ----------------------------------------------------
NO_FLUSH = ("import pagedllm.engine.tracing as tracing\n"
            "tracing.FLUSH_EVENTS = tracing.FLUSH_INTERVAL_NS = 10**18\n")


@pytest.fixture
def no_flush(monkeypatch):
    """Every span stays buffered until the trace ends (however long the steps take)."""
    from pagedllm.engine import tracing

    monkeypatch.setattr(tracing, "FLUSH_EVENTS", 10**18)
    monkeypatch.setattr(tracing, "FLUSH_INTERVAL_NS", 10**18)


def _steps(path) -> int:
    with open(path) as f:
        return sum(e["name"] == "step" for e in json.load(f)["traceEvents"])


def test_trace_is_written_when_the_llm_is_collected(tmp_path, no_flush):
    from pagedllm import LLM, SamplingParams

    path = tmp_path / "t.json"
    llm = LLM(num_threads=1, num_kv_blocks=64, profile_trace=str(path))
    llm.generate(["hello", "world"], SamplingParams(max_tokens=4, temperature=0),
                 use_tqdm=False)
    steps = llm.engine.num_steps
    assert _steps(path) == 0  # all buffered
    engine = weakref.ref(llm.engine)
    del llm
    gc.collect()
    assert engine() is None  # the finalizer does not keep the engine alive
    assert _steps(path) == steps


def test_a_stopped_trace_is_not_written_again(tmp_path, no_flush):
    from pagedllm import LLM, SamplingParams

    path = tmp_path / "t.json"
    llm = LLM(num_threads=1, num_kv_blocks=64, profile_trace=str(path))
    llm.generate(["hello"], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    tracer = llm.engine.tracer
    assert llm.stop_trace() == [str(path)]
    written = path.read_bytes()
    assert _steps(path) == llm.engine.num_steps and not tracer._finalizer.alive
    tracer.close()  # twice: nothing more
    del llm, tracer
    gc.collect()
    assert path.read_bytes() == written


def test_trace_is_written_at_interpreter_exit(tmp_path):
    path = tmp_path / "exit.json"
    script = (NO_FLUSH + "from pagedllm import LLM, SamplingParams\n"
              f"llm = LLM(num_threads=1, num_kv_blocks=64, profile_trace={str(path)!r})\n"
              "llm.generate(['hello', 'world'], SamplingParams(max_tokens=4, temperature=0),\n"
              "             use_tqdm=False)\n"
              "print(llm.engine.num_steps)\n")  # no stop_trace(), no close()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _steps(path) == int(proc.stdout.split()[-1]) > 0


# --- 4: monitor ---------------------------------------------------------------------------------
FIGURES = {P + "num_requests_running": 2.0, P + "time_to_first_token_seconds_sum": 0.3,
           P + "time_to_first_token_seconds_count": 3.0, P + "request_success_total": 5.0,
           P + "request_success_total{finished_reason=error}": 1.0,
           P + "sparse_read_size_count": 4.0, P + "sparse_read_size_sum": 10.0,
           P + "e2e_request_latency_seconds_count": 0.0,
           P + "e2e_request_latency_seconds_sum": 0.0}


@pytest.mark.parametrize("name,shown", [
    ("time_to_first_token_seconds", "mean 100.0 ms (3 observed)"),
    ("pagedllm:time_to_first_token_seconds", "mean 100.0 ms (3 observed)"),
    ("sparse_read_size", "mean 2.5 (4 observed)"),
    ("e2e_request_latency_seconds", "- (0 observed)"),
    ("request_success", "5"),                                  # a counter without _total
    ("request_success_total{finished_reason=error}", "1"),    # one labelled series
    ("num_requests_running", "2"),
])
def test_monitor_shows_any_metric_of_metrics_by_name(name, shown):
    lines = monitor.render("http://x", monitor.resolve_metrics([name]), (1.0, FIGURES), None)
    assert lines[1].split(None, 1)[1].strip() == shown, lines


def test_monitor_reads_a_histogram_of_a_stats_file(capsys, tmp_path):
    path = tmp_path / "r.prom"
    path.write_text("# TYPE pagedllm:time_to_first_token_seconds histogram\n"
                    'pagedllm:time_to_first_token_seconds_bucket{le="+Inf"} 2.0\n'
                    "pagedllm:time_to_first_token_seconds_count 2.0\n"
                    "pagedllm:time_to_first_token_seconds_sum 0.05\n")
    code, out, err = run_cli(capsys, "monitor", "--once", "--stats-file", path,
                             "--metric", "time_to_first_token_seconds")
    assert code == 0, err
    assert out.splitlines()[1].split() == ["time_to_first_token_seconds", "mean", "25.0", "ms",
                                           "(2", "observed)"]


@pytest.mark.parametrize("text,what", [
    ("", "(it is empty;"),
    ("\n\n", "(it is empty;"),
    ("# TYPE foo gauge\nfoo 1\nbar{x=\"1\"} 2\n", "(only 2 other metrics: bar, foo;"),
])
def test_monitor_stats_file_without_pagedllm_figures(capsys, tmp_path, text, what):
    path = tmp_path / "f.prom"
    path.write_text(text)
    code, out, err = run_cli(capsys, "monitor", "--once", "--stats-file", path)
    line = one_line(err)
    assert code == 1 and out == "", out
    assert f"stats file '{path}' holds no pagedllm figures {what}" in line, line
    assert "pagedllm generate --stats-file" in line and "check --stats-file" in line


def test_monitor_server_without_pagedllm_figures(capsys):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        code, out, err = run_cli(capsys, "monitor", "--once", "--url", url)
    finally:
        server.shutdown()
        server.server_close()
    line = one_line(err)
    assert code == 1 and out == ""
    assert f"{url}/metrics holds no pagedllm figures (only 1 other metric: " in line, line
    assert "is --url a pagedllm server?" in line


def test_monitor_labels_a_metric_missing_later_and_an_unreadable_file(capsys, tmp_path,
                                                                       monkeypatch):
    later = {k: v for k, v in FIGURES.items() if not k.startswith(P + "time_to_first")}
    snapshots = [(1.0, FIGURES), (2.0, later),
                 CliError("cannot read stats file 'x': Permission denied"), (3.0, FIGURES)]

    def read(path):
        item = snapshots.pop(0)
        if isinstance(item, Exception):
            raise item
        return item
    monkeypatch.setattr(monitor, "read_stats_file", read)
    code, out, err = run_cli(capsys, "monitor", "--stats-file", tmp_path / "x.prom",
                             "--count", 4, "--interval", 0.001,
                             "--metric", "running,time_to_first_token_seconds")
    assert code == 0, err
    screens = [s.splitlines() for s in out.split("pagedllm monitor: ")[1:]]
    assert screens[0][2].split()[-3:] == ["ms", "(3", "observed)"]
    assert screens[1][1].split()[-1] == "2"  # the other metrics still shown
    assert screens[1][2].split(None, 1)[1] == ("- (missing: not in the figures of this "
                                               "refresh)")
    assert screens[2][1] == "  unreadable: cannot read stats file 'x': Permission denied"
    assert "unreachable" not in out
    assert screens[3][2].endswith("(3 observed)")


def test_monitor_metric_missing_at_the_first_refresh_is_an_error(capsys, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setattr(monitor, "read_stats_file", lambda path: (1.0, FIGURES))
    code, _, err = run_cli(capsys, "monitor", "--once", "--stats-file", tmp_path / "x.prom",
                           "--metric", "no_such_metric")
    assert code == 1 and "no metric 'no_such_metric' in the figures" in one_line(err)


# --- 5: the finish reasons of /metrics in USAGE.md ------------------------------------------------
def test_usage_md_lists_every_finish_reason_of_request_success():
    with open(os.path.join(REPO, "docs", "USAGE.md"), encoding="utf-8") as f:
        row = next(line for line in f if line.startswith("| `pagedllm:request_success_total"))
    reasons = row.split("|")[3]
    for reason in ("stop", "length", "abort", "error"):
        assert reason in reasons, row


def test_bench_exits_1_naming_the_failed_requests(capsys, tmp_path, monkeypatch,
                                                  poisoned_generate):
    # bench printed its figures and exited 0 when requests failed.
    from pagedllm.commands import bench

    monkeypatch.setattr(bench, "build_engine", generate.build_engine)  # the poisoned one
    f = tmp_path / "w.jsonl"
    f.write_text("".join(json.dumps({"prompt": p, "max_tokens": 3}) + "\n"
                         for p in (GOOD, BAD, GOOD)))
    code, out, err = run_cli(capsys, "bench", *ENGINE, "--check-numerics", "fail", "--file", f,
                             "--no-progress", "--json", tmp_path / "b.json")
    assert code == 1, err
    assert "3 in " in out and "1 failed (counted in every figure)" in out, out
    failures = [l for l in err.splitlines() if l.startswith("pagedllm: error: ")]
    assert len(failures) == 1 and " failed: numeric check: NaN/Inf" in failures[0], err
    assert json.loads((tmp_path / "b.json").read_text())["num_failed"] == 1
