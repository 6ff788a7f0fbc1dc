"""Stopping the server under load (issue 20, defect 7): after the grace period every running
request ends with an OpenAI-shaped 503 (an SSE error event then [DONE] on streams); SIGTERM and
SIGINT both exit 0 after "server stopped"."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

import pagedllm
from pagedllm.server import create_app
from pagedllm.server.lifecycle import PagedServer, ServerLimits
from server_fixtures import ScriptedEngine, scrape

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pagedllm.__file__)))
DEADLINE_S = 120  # "does not hang"
# Long requests on the bundled model: seconds of decoding (3 choices of 900 tokens), far beyond
# the grace period.
LONG = {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True, "n": 3}
CHAT = {"messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 900,
        "ignore_eos": True, "n": 3, "stream": True}


def _start_serve(*flags):
    env = {**os.environ, "PYTHONPATH": PYTHON_DIR}
    proc = subprocess.Popen([sys.executable, "-m", "pagedllm", "serve", "--port", "0",
                             "--num-threads", "1", "--num-kv-blocks", "256",
                             "--log-level", "warning", *flags],
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    m = re.search(r"serving 'default_model' on (http://127\.0\.0\.1:\d+)", line)
    if not m:
        proc.kill()
        pytest.fail(f"the server did not start: {line}{proc.stderr.read()}")
    return proc, m.group(1)


def _wait_running(url, n):
    deadline = time.monotonic() + DEADLINE_S
    while scrape(url).get("pagedllm:num_requests_running", 0) < n:
        assert time.monotonic() < deadline, f"{n} requests never ran together"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_under_load_ends_every_request_cleanly_and_exits_0(sig):
    proc, url = _start_serve("--shutdown-grace", "0.2")
    results = {}

    def non_stream():
        results["plain"] = httpx.post(url + "/v1/completions", json=LONG, timeout=DEADLINE_S)

    def stream(key, route, body):
        events = []
        with httpx.stream("POST", url + route, json=body, timeout=DEADLINE_S) as r:
            results[key + "_status"] = r.status_code
            events.extend(line for line in r.iter_lines() if line)
        results[key] = events

    threads = [threading.Thread(target=non_stream, daemon=True),
               threading.Thread(target=stream, daemon=True,
                                args=("stream", "/v1/completions", {**LONG, "stream": True})),
               threading.Thread(target=stream, daemon=True,
                                args=("chat", "/v1/chat/completions", CHAT))]
    try:
        for t in threads:
            t.start()
        _wait_running(url, 3)
        proc.send_signal(sig)
        for t in threads:
            t.join(DEADLINE_S)
        assert not any(t.is_alive() for t in threads), "a client was left hanging"
        code = proc.wait(DEADLINE_S)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    plain = results["plain"]
    assert plain.status_code == 503, plain.text
    assert plain.headers["content-type"].startswith("application/json")
    error = plain.json()["error"]
    assert error["type"] == "service_unavailable_error" and "shutting down" in error["message"]

    for key, kind in (("stream", "text_completion"), ("chat", "chat.completion.chunk")):
        events = results[key]
        assert results[key + "_status"] == 200 and len(events) >= 3, events
        assert events[-1] == "data: [DONE]", events[-3:]
        last = json.loads(events[-2].removeprefix("data: "))
        assert last["error"]["type"] == "service_unavailable_error", last
        assert all(json.loads(e.removeprefix("data: ")).get("object") == kind
                   for e in events[:-2])  # tokens streamed before the stop

    assert code == 0, err
    assert f"server stopped ({signal.Signals(sig).name})" in err, err
    assert "ending them with 503" in err and "Traceback" not in err, err


def test_idle_server_stops_on_sigterm_with_exit_0():
    proc, url = _start_serve()
    try:
        assert httpx.get(url + "/health", timeout=DEADLINE_S).status_code == 200
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(DEADLINE_S)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0 and "server stopped (SIGTERM)" in err, err


def test_requests_that_finish_within_the_grace_period_are_answered():
    # A scripted engine (one token per 5 ms step): the request outlives the stop request but
    # not the grace period, so it completes normally and the server then stops.
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    limits = ServerLimits(shutdown_grace=DEADLINE_S)
    server = PagedServer(create_app(ScriptedEngine(step_delay=0.005), limits=limits), limits,
                         log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    result = {}
    client = threading.Thread(target=lambda: result.update(r=httpx.post(
        url + "/v1/completions", json={"prompt": "hi", "max_tokens": 200}, timeout=DEADLINE_S)))
    client.start()
    while scrape(url).get("pagedllm:num_requests_running", 0) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    server.should_exit = True
    client.join(DEADLINE_S)
    thread.join(DEADLINE_S)
    sock.close()
    assert not thread.is_alive()
    r = result["r"]
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 200
