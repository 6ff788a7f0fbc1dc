"""The figures of an offline run for `pagedllm monitor --stats-file` (`generate --stats-file`,
`bench --stats-file`).

The file holds exactly what a server's /metrics would (pagedllm.metrics: the same names,
gauges, counters and latency histograms), in the Prometheus text format, replaced atomically
(written to FILE.tmp, then renamed) at most every `interval_s` while the run goes and once at
its end, so a monitor reading it never sees half a file.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Dict, Iterable, List, Optional

from pagedllm.commands.common import UsageError, check_output_file


def add_stats_file_arg(parser) -> None:
    """--stats-file FILE (generate, bench)."""
    parser.add_argument("--stats-file", metavar="FILE",
                        help="keep the run's /metrics figures in FILE (rewritten every second "
                             "and at the end), for `pagedllm monitor --stats-file FILE`")


def check_stats_file(args: argparse.Namespace) -> None:
    """Checks --stats-file before the model loads: not a directory, in a writable directory.

    Raises:
        UsageError: it cannot be written (names --stats-file).
    """
    check_output_file(getattr(args, "stats_file", None), "--stats-file")


def open_stats_file(engine, args: argparse.Namespace) -> Optional["StatsFileWriter"]:
    """The --stats-file writer of an engine (None without the flag); the model_name label is
    the checkpoint directory's name, as the server's default.

    Raises:
        UsageError: the file cannot be written (names --stats-file).
    """
    path = getattr(args, "stats_file", None)
    if not path:
        return None
    name = os.path.basename(os.path.normpath(engine.model_path))
    try:
        return StatsFileWriter(engine, path, name)
    except (ValueError, OSError) as e:
        raise UsageError(f"{e} (fix --stats-file)") from None


class StatsFileWriter:
    """Keeps FILE up to date with one engine's metrics.

    Args:
        engine: the LLMEngine being driven (read between steps, on the caller's thread).
        path: the file to write.
        model_name: the model_name label.
        interval_s: least time between two writes while running.
    Raises:
        ValueError: `path` is a directory, or its directory does not exist.
    """

    def __init__(self, engine, path: str, model_name: str, interval_s: float = 1.0):
        directory = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise ValueError(f"stats file {path!r} is a directory")
        if not os.path.isdir(directory):
            raise ValueError(f"stats file {path!r}: directory {directory!r} does not exist")
        from pagedllm.metrics import EngineMetrics  # prometheus_client: only when used

        self.engine = engine
        self.path = path
        self.interval_s = interval_s
        self.metrics = EngineMetrics(self._stats, model_name)
        self._last_write = float("-inf")
        self.write()  # a monitor started now finds the file at once

    def _stats(self) -> Dict[str, Any]:
        stats = dict(self.engine.kv_cache_stats())
        stats["num_prompt_tokens"] = self.engine.num_prompt_tokens
        stats["num_generation_tokens"] = self.engine.num_generation_tokens
        stats["num_steps"] = self.engine.num_steps
        return stats

    def after_step(self, outputs: List) -> None:
        """Observes one step's outputs; rewrites the file when interval_s has passed."""
        now = time.monotonic()
        self.metrics.on_outputs(outputs, now)
        if now - self._last_write >= self.interval_s:
            self.write()

    def aborted(self, request_ids: Iterable[str]) -> None:
        """Counts requests the run aborted (it was interrupted) as the server counts them."""
        for request_id in request_ids:
            self.metrics.on_abort(request_id)

    def write(self) -> None:
        """Writes the file now (atomically; no FILE.tmp is left behind when it fails)."""
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(self.metrics.render())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._last_write = time.monotonic()
