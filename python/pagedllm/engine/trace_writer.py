"""ChromeTraceWriter: streams complete-span events into a Chrome/Perfetto trace JSON file.

The file is `{"displayTimeUnit": "ms", "traceEvents": [...]}` and is valid JSON after every
flush: each flush overwrites the closing `]}` with `,` + the new events + `]}`, so a server
killed between flushes leaves a readable trace of everything flushed. Events are "X" (complete)
events with microsecond `ts`/`dur` relative to the writer's origin, one `tid` per recording
thread (named by "M" thread_name events), formatted by hand (our span names need no
escaping; only `args` go through json.dumps).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Dict, Iterable, Optional, Tuple

# (name, category, start ns, end ns, thread ident, args or None)
Event = Tuple[str, str, int, int, int, Optional[dict]]

_TAIL = "\n]}\n"


class ChromeTraceWriter:
    """One trace file.

    Args:
        path: the file to write (created or truncated now).
        origin_ns: the perf_counter_ns() value that becomes ts 0.
    Raises:
        ValueError: `path` is a directory, or its directory does not exist.
        OSError: the file cannot be created.
    """

    def __init__(self, path: str, origin_ns: int):
        directory = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise ValueError(f"trace file {path!r} is a directory: expected a file path")
        if not os.path.isdir(directory):
            raise ValueError(f"trace file {path!r}: directory {directory!r} does not exist")
        self.path = path
        self.origin_ns = origin_ns
        self.pid = os.getpid()
        self.num_events = 0
        self._tids: Dict[int, int] = {}
        # write() and close() may race at interpreter exit (a finalizer on the main thread,
        # a step ending on the engine's thread): one at a time, nothing written after close.
        self._lock = threading.Lock()
        self._file = open(path, "w", encoding="utf-8")
        head = (f'{{"displayTimeUnit": "ms", "traceEvents": [\n'
                f'{{"name": "process_name", "ph": "M", "pid": {self.pid}, "tid": 0, '
                f'"args": {{"name": "pagedllm engine"}}}}')
        self._file.write(head)
        self._tail_at = self._file.tell()
        self._file.write(_TAIL)
        self._file.flush()

    @property
    def closed(self) -> bool:
        """True once close() ran (later writes are ignored)."""
        return self._file is None

    def write(self, events: Iterable[Event]) -> None:
        """Appends events (any order; viewers sort by ts) and leaves the file valid JSON;
        nothing once the writer is closed."""
        with self._lock:
            if self._file is None:
                return
            lines = [self._format(e) for e in events]
            if not lines:
                return
            self._file.seek(self._tail_at)
            self._file.write(",\n" + ",\n".join(lines))
            self._tail_at = self._file.tell()
            self._file.write(_TAIL)
            self._file.flush()
            self.num_events += len(lines)

    def close(self) -> None:
        """Closes the file (it is complete already)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _format(self, e: Event) -> str:
        name, cat, t0, t1, ident, args = e
        tid = self._tids.get(ident)
        prefix = ""
        if tid is None:
            tid = self._tids[ident] = len(self._tids) + 1
            prefix = (f'{{"name": "thread_name", "ph": "M", "pid": {self.pid}, "tid": {tid}, '
                      f'"args": {{"name": {json.dumps(_thread_name(ident))}}}}},\n')
        text = (f'{{"name": "{name}", "cat": "{cat}", "ph": "X", '
                f'"ts": {(t0 - self.origin_ns) / 1000:.3f}, "dur": {(t1 - t0) / 1000:.3f}, '
                f'"pid": {self.pid}, "tid": {tid}')
        if args:
            if args.get("blocks"):  # a transfer span: its latency per block
                args = {**args, "us_per_block": round((t1 - t0) / 1000 / args["blocks"], 2)}
            text += f', "args": {json.dumps(args)}'
        return prefix + text + "}"


def _thread_name(ident: int) -> str:
    for t in threading.enumerate():
        if t.ident == ident:
            return t.name
    return f"thread {ident}"
