"""Slow and greedy clients (issue 20, defect 10): partial headers and partial bodies are timed
out, connections are capped, and normal requests are answered meanwhile."""

import json
import socket
import threading
import time

import httpx
import pytest

from pagedllm.server import create_app
from pagedllm.server.lifecycle import PagedServer, ServerLimits
from server_fixtures import ScriptedEngine

DEADLINE_S = 30  # "the server closes it": far above the timeouts configured below
COMPLETION = {"prompt": "hi", "max_tokens": 4}


class LimitedServer:
    """PagedServer on a free loopback port in a background thread (a context manager)."""

    def __init__(self, limits: ServerLimits):
        self.limits = limits
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(ScriptedEngine(), limits=limits)
        self.server = PagedServer(app, limits, log_level="warning")
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        daemon=True)

    def __enter__(self) -> "LimitedServer":
        self._thread.start()
        deadline = time.monotonic() + DEADLINE_S
        while not self.server.started:
            assert self._thread.is_alive() and time.monotonic() < deadline, "did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(DEADLINE_S)
        self._sock.close()

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE_S)
        return s


def read_until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails on the deadline)."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            pytest.fail(f"the server kept the connection open for {DEADLINE_S} s; got {data!r}")
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def error_of(response: bytes) -> tuple:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body)["error"]


@pytest.fixture
def server():
    with LimitedServer(ServerLimits(header_timeout=0.5, body_timeout=0.5, max_connections=64,
                                    shutdown_grace=1)) as s:
        yield s


def test_partial_headers_are_timed_out_with_408(server):
    with server.connect() as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        status, error = error_of(read_until_closed(s))
    assert status == 408 and "headers were not received within 0.5 s" in error["message"]


def test_a_connection_that_sends_nothing_is_closed(server):
    with server.connect() as s:
        assert read_until_closed(s) == b""


def test_partial_body_is_timed_out_with_408(server):
    with server.connect() as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        response = read_until_closed(s)
    status, error = error_of(response)
    assert status == 408 and "body was not received within 0.5 s" in error["message"]
    assert b"connection: close" in response.lower()


def test_chunked_body_that_never_ends_is_timed_out(server):
    with server.connect() as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n4\r\n{\"pr\r\n")
        status, _ = error_of(read_until_closed(s))
    assert status == 408


def test_slowloris_after_a_keep_alive_request_is_timed_out(server):
    with server.connect() as s:
        body = json.dumps(COMPLETION).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        first = b""
        while b"\r\n\r\n" not in first or not first.rstrip().endswith(b"}"):
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the next request, never finished
        status, _ = error_of(read_until_closed(s))
    assert status == 408


def test_normal_requests_are_answered_while_slow_clients_hang(server):
    slow = [server.connect() for _ in range(20)]
    try:
        for i, s in enumerate(slow):
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else
                      b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
        with httpx.Client(base_url=server.url, timeout=DEADLINE_S) as c:
            r = c.post("/v1/completions", json=COMPLETION)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            assert c.get("/health").status_code == 200
        for s in slow:
            assert error_of(read_until_closed(s))[0] == 408
    finally:
        for s in slow:
            s.close()


def test_connections_beyond_the_cap_get_503_and_are_closed():
    limits = ServerLimits(header_timeout=DEADLINE_S * 4, max_connections=3)
    with LimitedServer(limits) as server:
        held = [server.connect() for _ in range(3)]
        try:
            with server.connect() as extra:  # the 4th
                status, error = error_of(read_until_closed(extra))
            assert status == 503 and "accepts 3 at once" in error["message"]
            # the held ones still work
            held[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_until_closed(held[0]).startswith(b"HTTP/1.1 200")
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + DEADLINE_S  # the server sees the closes asynchronously
        while True:
            try:
                r = httpx.get(server.url + "/health", timeout=DEADLINE_S)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the cap was not released"
            time.sleep(0.05)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="header_timeout must be > 0"):
        ServerLimits(header_timeout=0)
    with pytest.raises(ValueError, match="max_connections must be >= 1"):
        ServerLimits(max_connections=0)
    with pytest.raises(ValueError, match="shutdown_grace must be >= 0"):
        ServerLimits(shutdown_grace=-1)


@pytest.mark.parametrize("argv, match", [
    (["--timeout-header", "0"], "--timeout-header: must be > 0 seconds"),
    (["--timeout-body", "nan"], "--timeout-body: must be a finite number"),
    (["--max-connections", "0"], "--max-connections: must be >= 1"),
    (["--shutdown-grace", "-1"], "--shutdown-grace: must be a finite number >= 0"),
])
def test_serve_flags_are_checked_before_the_model_loads(capsys, tmp_path, argv, match):
    from pagedllm import cli

    code = cli.main(["serve", "--model", str(tmp_path / "missing"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and match in err, err
