"""Shared helpers of the benchmark scripts: timing, machine facts, JSON results."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Set by `python -m benchmarks --quick` (and the smoke test) so that trial runs never overwrite
# the committed results.
RESULTS_DIR_ENV = "PAGEDLLM_BENCH_RESULTS_DIR"
# Random-weight checkpoints are written once here ($PAGEDLLM_BENCH_CHECKPOINTS overrides).
CHECKPOINT_CACHE_ENV = "PAGEDLLM_BENCH_CHECKPOINTS"
CHECKPOINT_CACHE = Path.home() / ".cache" / "pagedllm" / "bench-checkpoints"


def results_dir() -> Path:
    """Where results go: $PAGEDLLM_BENCH_RESULTS_DIR if set, else benchmarks/results/."""
    env = os.environ.get(RESULTS_DIR_ENV)
    return Path(env) if env else RESULTS_DIR


def median_time(fn: Callable[[], object], repeats: int = 7, warmup: int = 1) -> float:
    """Median wall time of `fn()` in seconds.

    Args:
        fn: the work to time; called warmup + repeats times.
        repeats: timed calls (the median is returned: the machine is shared and noisy).
        warmup: untimed calls first.
    Returns:
        The median duration in seconds.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cpu_ticks() -> Optional[tuple]:
    """(busy, total) jiffies of all CPUs from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            t = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(t[:3]) + sum(t[5:7]), sum(t)  # user nice system + irq softirq (not steal)


def wait_until_quiet(threshold: float = 0.1, window_s: float = 0.25, max_wait_s: float = 10.0,
                     ) -> float:
    """Waits until the CPUs are idle: a `window_s` window in which under `threshold` of the
    machine's CPU time was busy (or `max_wait_s` passed). Returns the seconds waited.

    An engine that has just finished a run may keep a core busy for a while: vLLM's CPU build
    keeps one of two cores fully busy for about a second after each generate call returns (its
    worker polling). A timed run that starts then loses that core, so every timed run of the
    throughput benchmarks starts after this wait, whichever engine ran before.
    """
    t0 = time.perf_counter()
    prev = _cpu_ticks()
    if prev is None:
        return 0.0
    while time.perf_counter() - t0 < max_wait_s:
        time.sleep(window_s)
        cur = _cpu_ticks()
        busy, total = cur[0] - prev[0], cur[1] - prev[1]
        prev = cur
        if total > 0 and busy / total < threshold:
            break
    return time.perf_counter() - t0


# Environment variables that change what a run executes (instruction sets, kernel and backend
# choices, threads); machine_info records those that are set.
RUN_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
           "OMP_NUM_THREADS", "OMP_WAIT_POLICY")


def run_environment() -> dict:
    """The RUN_ENV and PAGEDLLM_* variables of this process that are set, by name (not those
    that only say where files go)."""
    places = (RESULTS_DIR_ENV, CHECKPOINT_CACHE_ENV)
    return {k: v for k, v in sorted(os.environ.items())
            if k in RUN_ENV or (k.startswith("PAGEDLLM_") and k not in places)}


def machine_info() -> dict:
    """Facts that make a figure comparable: CPU, cores, versions, date, and the environment
    variables that change what runs (`run_environment`, when any is set)."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    env = run_environment()
    if env:
        info["environment"] = env
    try:
        import pagedllm

        info["pagedllm"] = pagedllm.__version__
    except ImportError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def write_results(name: str, payload: dict) -> Path:
    """Writes `payload` plus machine facts to benchmarks/results/<name>.json.

    Args:
        name: file stem, e.g. "allocator".
        payload: JSON-serialisable results.
    Returns:
        The path written.
    """
    out_dir = results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    data = {"machine": machine_info(), **payload}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def checkpoint(preset, seed: int = 0, root: Optional[Path] = None) -> str:
    """A random-weight fp32 Llama checkpoint directory, written once and reused.

    The weights depend only on the preset and the seed (see write_random_checkpoint), so a
    cached directory is the same model every engine loads.

    Args:
        preset: a PRESETS name ("tiny", "small") or a dict of config.json fields.
        seed: seed of the weights.
        root: the cache folder (default $PAGEDLLM_BENCH_CHECKPOINTS or CHECKPOINT_CACHE).
    Returns:
        The checkpoint directory.
    """
    from pagedllm.model.checkpoint import random_config, write_random_checkpoint

    # The folder name carries a hash of the full config, so a changed preset is a new folder.
    key = json.dumps(random_config(preset).to_hf_dict(), sort_keys=True).encode()
    label = preset if isinstance(preset, str) else "custom"
    name = f"{label}-{hashlib.sha1(key).hexdigest()[:10]}-seed{seed}"
    root = Path(root or os.environ.get(CHECKPOINT_CACHE_ENV) or CHECKPOINT_CACHE)
    path = root / name
    done = path / ".complete"
    if not done.exists():
        write_random_checkpoint(path, preset, seed=seed)
        done.write_text("ok\n")
    return str(path)
