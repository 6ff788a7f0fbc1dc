"""The worker side of the peer protocol (worker_client.py is the other side); stdlib only, so
it runs in every peer's own venv.

A worker prints one `ready` reply, then serves JSON commands, one per stdin line, each naming an
`op`. Each reply is one stdout line starting with MARKER followed by JSON (the engines log to
stdout too; the client keeps only marked lines).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable, Dict, List, Optional

MARKER = "@@pagedllm-bench@@ "


def process_tree(pid: int) -> List[int]:
    """pid and all its descendants (from /proc; a process that ended meanwhile is left out)."""
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out += process_tree(int(child))
    except FileNotFoundError:
        pass
    return out


def reply(obj: dict) -> None:
    """Writes one marked JSON reply and flushes it."""
    sys.stdout.write(MARKER + json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve(handlers: Dict[str, Callable[[dict], Optional[dict]]]) -> None:
    """Answers stdin commands until `quit` or end of input.

    Args:
        handlers: op -> function of the command returning the reply (None: {"event": "ok"}).
            An unknown op, or an exception in a handler, is answered with an error event and
            the worker keeps serving.
    """
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "quit":
            reply({"event": "bye"})
            return
        try:
            if op not in handlers:
                reply({"event": "error", "error": f"unknown op {op!r}"})
                continue
            reply(handlers[op](cmd) or {"event": "ok"})
        except Exception as e:  # report, keep serving
            reply({"event": "error", "error": f"{type(e).__name__}: {e}"})
