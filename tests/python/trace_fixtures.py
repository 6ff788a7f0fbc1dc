"""Helpers of the trace tests: read a Chrome trace JSON and check its spans' structure."""

from __future__ import annotations

import json

from pagedllm.engine import tracing


def spans(path):
    """The trace's complete events, by start time."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return sorted((e for e in events if e["ph"] == "X"), key=lambda e: (e["ts"], -e["dur"]))


def children(parent, events):
    """The events directly inside `parent` (same thread), in order."""
    lo, hi = parent["ts"], parent["ts"] + parent["dur"]
    inside = [e for e in events if e is not parent and e["tid"] == parent["tid"]
              and lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 0.002]
    return [e for e in inside if not any(o is not e and o["ts"] <= e["ts"] and
                                         e["ts"] + e["dur"] <= o["ts"] + o["dur"] + 0.002
                                         for o in inside)]


def assert_properly_nested(events):
    """Any two spans of one thread are disjoint or one holds the other (a tree)."""
    by_tid = {}
    for e in events:
        by_tid.setdefault(e["tid"], []).append(e)
    for evs in by_tid.values():
        stack = []
        for e in evs:
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            assert not stack or end <= stack[-1] + 0.002, e
            stack.append(end)


def assert_step_structure(events, layers: bool, numerics: bool = False, num_layers: int = 2):
    """Every step holds schedule, execute, [numerics], sample, update in order; execute holds
    the kv.* moves, then prepare_inputs, [encoder], forward, logits; forward holds layer 0..num_layers-1
    (with layers); update holds at most a detokenize span. At least two full steps."""
    steps = [e for e in events if e["name"] == "step"]
    assert steps and [s["args"]["step"] for s in steps] == list(range(len(steps)))
    full = 0
    for s in steps:
        names = [e["name"] for e in children(s, events)]
        expected = (["schedule", "execute"] + (["numerics"] if numerics else [])
                    + ["sample", "update"])
        assert names in (expected, ["schedule"]), names
        if names == ["schedule"]:
            continue
        full += 1
        execute = next(e for e in children(s, events) if e["name"] == "execute")
        inner = [e["name"] for e in children(execute, events)]
        core = [n for n in inner if not n.startswith("kv.")]
        if "encoder" in core:  # a step with images: the encoder runs right before the forward
            assert core.index("encoder") == core.index("forward") - 1, core
            core.remove("encoder")
        assert core == list(tracing.WORKER_SPANS), inner
        assert inner.index("prepare_inputs") >= len([n for n in inner if n.startswith("kv.")])
        forward = next(e for e in children(execute, events) if e["name"] == "forward")
        got = [e["name"] for e in children(forward, events)]
        assert got == ([f"layer {i}" for i in range(num_layers)] if layers else []), got
        update = next(e for e in children(s, events) if e["name"] == "update")
        assert [e["name"] for e in children(update, events)] in ([], ["detokenize"])
    assert full >= 2
