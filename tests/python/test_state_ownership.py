"""Structural check: only the scheduler (and the update helpers it alone calls) writes request
and sequence state; nothing above the worker imports the worker's device-side modules.

Scans the package's source with `ast`: an assignment to, or a mutating call on, one of the
Request / Sequence state attributes outside the allowed modules fails the test, naming the file
and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pagedllm

PKG = Path(pagedllm.__file__).resolve().parent

# Request and Sequence fields that change over a request's life.
STATE_ATTRS = {
    "token_ids", "num_computed_tokens", "status", "finish_reason", "stop_reason", "output_text",
    "cumulative_logprob", "output_logprobs", "detokenizer", "num_preemptions", "beam_pending",
    "beam_logprobs", "host_blocks", "seqs", "forked", "first_token_time", "finish_time",
    "prompt_logprobs", "block_hashes", "error", "beam",
}
MUTATORS = {"append", "extend", "pop", "insert", "remove", "clear", "sort", "reverse"}
# The scheduler and the helpers that only its update_from_output calls.
OWNERS = {"engine/scheduler.py", "engine/output_processor.py", "engine/stop_checker.py",
          "engine/beam_search.py", "engine/sequence.py"}
HELPERS = {"pagedllm.engine.output_processor", "pagedllm.engine.stop_checker",
           "pagedllm.engine.beam_search"}


def _sources():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        yield rel, ast.parse(path.read_text(), filename=str(path))


def _target_attr(node):
    """The attribute name of an `x.attr` target (not `self.attr` outside sequence.py)."""
    if isinstance(node, ast.Attribute):
        base = node.value
        if isinstance(base, ast.Name) and base.id == "self":
            return None  # an object's own fields; Request/Sequence are checked in sequence.py
        return node.attr
    return None


def test_only_the_scheduler_writes_request_state():
    offences = []
    for rel, tree in _sources():
        if rel in OWNERS:
            continue
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    attr = _target_attr(sub) if isinstance(sub, ast.Attribute) else None
                    if attr in STATE_ATTRS and sub is t:
                        offences.append(f"{rel}:{node.lineno}: assigns .{attr}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Attribute)
                    and _target_attr(node.func.value) in STATE_ATTRS):
                offences.append(f"{rel}:{node.lineno}: calls .{node.func.value.attr}."
                                f"{node.func.attr}()")
    assert not offences, "request/sequence state written outside the scheduler:\n" + "\n".join(
        offences)


def test_update_helpers_are_reached_only_through_the_scheduler():
    users = {}
    for rel, tree in _sources():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                if n in HELPERS:
                    users.setdefault(n, set()).add(rel)
    for helper, files in users.items():
        assert files <= OWNERS, f"{helper} imported by {sorted(files - OWNERS)}"


def test_nothing_above_the_worker_imports_device_modules():
    # The engine loop, the scheduler, the API and the server reach the device only through the
    # executor; they never import the model, the runner, the pools or the kernels' dispatcher.
    device_side = {"pagedllm.engine.worker", "pagedllm.engine.model_runner",
                   "pagedllm.engine.kv_transfer", "pagedllm.engine.host_swap",
                   "pagedllm.ops", "pagedllm.model.llama", "pagedllm.model.attention"}
    above = ["engine/llm_engine.py", "engine/scheduler.py", "engine/async_engine.py", "llm.py"]
    above += [p.relative_to(PKG).as_posix() for p in (PKG / "server").glob("*.py")]
    for rel, tree in _sources():
        if rel not in above:
            continue
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            bad = [m for m in mods if m in device_side]
            assert not bad, f"{rel}:{node.lineno} imports {bad} (device side: go through the executor)"
