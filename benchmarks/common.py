"""Shared helpers of the benchmark scripts: timing, machine facts, JSON results."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

RESULTS_DIR = Path(__file__).resolve().parent / "results"


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


def machine_info() -> dict:
    """Facts that make a figure comparable: CPU, cores, versions, date."""
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
    }
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
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    data = {"machine": machine_info(), **payload}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
