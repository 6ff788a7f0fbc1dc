"""A peer engine living in a subprocess (its own venv), driven by JSON lines.

The worker scripts (vllm_runner.py, llamacpp_runner.py) start their engine once, send
{"event": "ready", ...}, then answer one command per stdin line with one stdout line that
starts with MARKER (engines log to stdout too: every other line goes to the log file):

    {"op": "generate", "requests": [{"prompt_token_ids": [...], "max_tokens": n}, ...], "keep": 8}
    {"op": "quit"}

A generate reply holds elapsed_s (timed inside the worker, the generate call only),
output_tokens and the first `keep` tokens of each request.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import List, Optional, Sequence

from benchmarks.engines import KEEP_TOKENS, RunResult
from benchmarks.workloads import BenchRequest

from benchmarks.peers.worker_protocol import MARKER


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (not installed, failed to start); the message says why."""


class WorkerPeer:
    """One engine in a subprocess.

    Args:
        name: the engine's name in results.
        cmd: the worker's command line (its venv's python, the script, its arguments).
        env: extra environment variables.
        log_path: where the worker's output goes.
        startup_timeout_s: give up waiting for "ready" after this long.
    Raises:
        PeerUnavailable: the worker exited or timed out before it was ready.
    """

    def __init__(self, name: str, cmd: Sequence[str], env: Optional[dict] = None,
                 log_path: Optional[Path] = None, startup_timeout_s: float = 900.0):
        self.name = name
        self.log_path = Path(log_path or f"/tmp/pagedllm-bench-{name}.log")
        self._log = open(self.log_path, "a")
        full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
        full_env.update(env or {})
        self._proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, text=True, env=full_env, bufsize=1)
        self._replies: "queue.Queue[Optional[dict]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._wait(startup_timeout_s)
        if ready.get("event") != "ready":
            self.close()
            raise PeerUnavailable(f"{name} did not start: {ready.get('error', ready)} "
                                  f"(log: {self.log_path})")
        self.info = ready
        self.startup_s = ready["startup_s"]
        self.version = ready["version"]

    def _read(self) -> None:
        for line in self._proc.stdout:
            if line.startswith(MARKER):
                self._replies.put(json.loads(line[len(MARKER):]))
            else:
                self._log.write(line)
        self._replies.put(None)  # the worker exited

    def _wait(self, timeout_s: float) -> dict:
        try:
            msg = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            return {"event": "error", "error": f"no reply within {timeout_s:.0f} s"}
        if msg is None:
            return {"event": "error", "error": f"worker exited with code {self._proc.wait()}"}
        return msg

    def call(self, cmd: dict, timeout_s: float = 3600.0) -> dict:
        """Sends one command and returns the worker's reply.

        Raises:
            PeerUnavailable: the worker has exited.
            RuntimeError: the worker answered with an error.
        """
        if self._proc.poll() is not None:
            raise PeerUnavailable(f"{self.name} worker has exited ({self._proc.returncode}); "
                                  f"see {self.log_path}")
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        msg = self._wait(timeout_s)
        if msg.get("event") == "error":
            raise RuntimeError(f"{self.name} worker: {msg['error']} (log: {self.log_path})")
        return msg

    def generate(self, reqs: List[BenchRequest], **options) -> RunResult:
        """Runs `reqs` in the worker (greedy, forced lengths) and returns its timing.

        Args:
            reqs: the workload.
            **options: worker-specific generate options (n, temperature, seed for vLLM).
        """
        msg = self.call({"op": "generate", "keep": KEEP_TOKENS, **options,
                         "requests": [{"prompt_token_ids": r.prompt_token_ids,
                                       "max_tokens": r.max_tokens} for r in reqs]})
        return RunResult(self.name, msg["elapsed_s"], msg["output_tokens"], msg["first_tokens"],
                         msg.get("ttft_s"), msg.get("extra", {}))

    def close(self) -> None:
        """Stops the worker (politely, then by force)."""
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.flush()

    def __enter__(self) -> "WorkerPeer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def venv_python(setup_script: Path, venv: Path, build: bool = True) -> str:
    """The python of a peer's venv; `setup_script` makes the venv (once) and prints it.

    Raises:
        PeerUnavailable: no venv and `build` is False, or the setup script failed.
    """
    if not build and not (venv / "bin" / "python").exists():
        raise PeerUnavailable(f"no venv at {venv} (run bash {setup_script})")
    res = subprocess.run(["bash", str(setup_script)], capture_output=True, text=True)
    if res.returncode != 0:
        raise PeerUnavailable(f"{setup_script} failed: {res.stderr.strip()[-500:]}")
    return res.stdout.strip().splitlines()[-1]
