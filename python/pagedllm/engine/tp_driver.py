"""What both distributed executors do on the driver with the ranks' replies to a step.

Every rank answers every step. All "ok": rank 0's payload is the step's logits. All "error"
with the same message: the step's inputs were refused before any collective (every rank
checks the same arrays the same way), the group is still in step, and the engine fails only
that step's requests (a plain RuntimeError, as the in-process executor raises). Anything else
(some ranks failed, a rank died or did not answer) leaves the group out of step: the executor
is dead (ExecutorDeadError, naming the ranks), and the engine stops.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from pagedllm.engine.executor import ExecutorDeadError, StepRefusedError
from pagedllm.engine.model_runner import ModelOutput
from pagedllm.engine.tp_worker import Reply, decode_output
from pagedllm.model.errors import CheckpointError

# Errors every rank raises alike while starting: the user's to fix, re-raised as themselves.
_CONFIG_ERRORS = {"ValueError": ValueError, "CheckpointError": CheckpointError}


def merge_replies(replies: Dict[int, Reply]) -> ModelOutput:
    """The step's result from every rank's reply (see the module docstring).

    Args:
        replies: rank -> ("ok", payload) | ("error", message), one per rank.
    Returns:
        rank 0's logits.
    Raises:
        StepRefusedError: every rank refused the step with the same message.
        ExecutorDeadError: some ranks failed and others did not.
    """
    errors = {r: msg for r, (kind, msg) in replies.items() if kind != "ok"}
    if not errors:
        return decode_output(replies[0][1])
    if len(errors) == len(replies) and len(set(errors.values())) == 1:
        raise StepRefusedError(next(iter(errors.values())))
    raise ExecutorDeadError("tensor-parallel step failed on " + "; ".join(
        f"rank {r}: {msg}" for r, msg in sorted(errors.items())))


def laggards(progress: Sequence[int], pending: Sequence[int]) -> List[int]:
    """The ranks that stopped first: the fewest collectives entered (every pending rank when
    they are level, e.g. one stuck before the first collective of a step)."""
    if not pending:
        return []
    low = min(progress[r] for r in range(len(progress)))
    behind = [r for r in range(len(progress)) if progress[r] == low]
    return behind if low < max(progress) else sorted(pending)


def startup_error(replies: Dict[int, Reply]) -> Optional[Exception]:
    """The exception for the ranks' replies to starting (None: every rank started).

    The same ValueError or CheckpointError on every rank (a bad option, a bad checkpoint) is
    re-raised as itself; anything else is an ExecutorDeadError naming the ranks that failed.
    """
    errors = {r: msg for r, (kind, msg) in replies.items() if kind != "ok"}
    if not errors:
        return None
    first = next(iter(errors.values()))
    kind, _, message = first.partition(": ")
    if kind in _CONFIG_ERRORS and len(errors) == len(replies) and len(set(errors.values())) == 1:
        return _CONFIG_ERRORS[kind](message)
    return ExecutorDeadError("tensor-parallel ranks failed to start: " + "; ".join(
        f"rank {r}: {m}" for r, m in sorted(errors.items())))
