"""MultiprocExecutor: tensor_parallel_size ranks in spawned local processes.

    driver (engine thread)                 rank r process (mp_worker_main), r = 0..tp-1
    ----------------------                 --------------------------------------------
    pickle StepInputs once  --pipe r-->    recv; Worker.execute_model (all-reduces over
                                           torch.distributed, gloo / nccl, among the ranks)
    wait for every reply    <--pipe r--    rank 0: ("ok", logits as numpy); others ("ok", None)

The driver is not a member of the process group: it never blocks in a collective, so it can
watch the ranks while they work. It waits on the reply pipes and on every process's sentinel
with the deadline distributed_timeout_s: a rank that exits is named with its exit code; a
step past the deadline names the ranks that stopped first (a shared array counts the
collectives each rank has entered: the hung one is behind). Either way the executor kills
every rank and raises ExecutorDeadError, and the engine stops. Ranks exit by themselves when
the driver dies (distributed.watch_parent).

Pipes rather than torch.distributed.broadcast_object_list for the step's inputs: one pickle and
tp pipe writes of a few KB took 0.2-0.45 ms for a 64-sequence step against 0.8-1.3 ms
(benchmarks/bench_tp.py, docs/BENCHMARKS.md), and the driver stays out of the group.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import time
import weakref
from multiprocessing.connection import wait
from typing import Dict, List, Optional

import torch.multiprocessing as tmp

from pagedllm.config import EngineConfig
from pagedllm.engine.distributed import StepInputs
from pagedllm.engine.executor import Executor, ExecutorDeadError
from pagedllm.engine.model_runner import ModelOutput
from pagedllm.engine.scheduler import SchedulerOutput
from pagedllm.engine.tp_driver import laggards, merge_replies, startup_error
from pagedllm.engine.tp_worker import Reply, mp_worker_main

logger = logging.getLogger("pagedllm")

# After a rank fails, how long the driver waits for the others (a peer's death is often seen
# by a survivor's collective first: give the dead one's sentinel time to show).
_SETTLE_S = 1.0
# How long shutdown waits for a rank to leave before killing it.
_EXIT_WAIT_S = 5.0
# Starting a rank (importing torch, joining the group, loading its shard) may take longer than
# a step: it gets at least this long (a rank that dies meanwhile is reported at once).
START_TIMEOUT_S = 600.0


def free_port() -> int:
    """A TCP port free on the loopback interface now (for the rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_processes(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(_EXIT_WAIT_S)


class MultiprocExecutor(Executor):
    """The ranks of one tensor-parallel group as spawned processes on this host.

    Args:
        config: the engine options (tensor_parallel_size, distributed_timeout_s, ...).
        model_path: the checkpoint directory.
    Raises:
        ValueError / CheckpointError: as the Worker (rank 0's error when every rank fails).
        ExecutorDeadError: a rank died or did not finish loading in time.
    """

    def __init__(self, config: EngineConfig, model_path: str):
        self.world_size = config.tensor_parallel_size
        self.timeout_s = float(config.distributed_timeout_s)
        self._dead: Optional[str] = None
        ctx = tmp.get_context("spawn")
        self._progress = ctx.Array("q", self.world_size, lock=False)
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self._conns, self._procs = [], []
        for rank in range(self.world_size):
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=mp_worker_main, name=f"pagedllm-tp-rank{rank}",
                               args=(rank, self.world_size, init_method, config, model_path,
                                     child, os.getpid(), self._progress), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        # An executor dropped without shutdown() still takes its ranks with it.
        weakref.finalize(self, _kill_processes, list(self._procs))
        replies = self._collect("loading the model", max(self.timeout_s, START_TIMEOUT_S))
        error = startup_error(replies)
        if error is not None:
            self._kill_all()
            raise error
        self.model_config, self.layout, self._device, self._dtype = replies[0][1]
        logger.info("tensor parallel: %d ranks (pids %s) on %s, %s", self.world_size,
                    self.worker_pids, self._device, self._dtype)

    @property
    def worker_pids(self) -> List[int]:
        """The ranks' process ids, rank order."""
        return [p.pid for p in self._procs]

    def execute_model(self, out: SchedulerOutput) -> ModelOutput:
        if self._dead is not None:
            raise ExecutorDeadError(self._dead)
        data = pickle.dumps(("step", StepInputs.of(out)), protocol=5)
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(data)
            except OSError:
                self._fail(self._death_message(rank) or f"rank {rank}: its pipe is closed")
        replies = self._collect("a step", self.timeout_s)
        try:
            return merge_replies(replies)
        except ExecutorDeadError as e:
            self._fail(str(e))

    def _collect(self, what: str, timeout_s: float) -> Dict[int, Reply]:
        """Every rank's reply within timeout_s, or ExecutorDeadError naming the ranks that died
        or hung."""
        deadline = time.monotonic() + timeout_s
        replies: Dict[int, Reply] = {}
        pending = set(range(self.world_size))
        sentinels = {p.sentinel: r for r, p in enumerate(self._procs)}
        settle_by: Optional[float] = None
        while pending:
            now = time.monotonic()
            until = deadline if settle_by is None else min(deadline, settle_by)
            if now >= until:
                break
            conns = {self._conns[r]: r for r in pending}
            ready = wait(list(conns) + list(sentinels), timeout=until - now)
            for obj in ready:
                if obj in conns:
                    rank = conns[obj]
                    try:
                        replies[rank] = pickle.loads(obj.recv_bytes())
                    except (EOFError, OSError):
                        continue  # its sentinel tells why
                    pending.discard(rank)
                    if replies[rank][0] != "ok" and settle_by is None:
                        settle_by = time.monotonic() + _SETTLE_S
            dead = [m for m in (self._death_message(r) for r in range(self.world_size)) if m]
            if dead:
                hint = ""
                if what == "loading the model" and not replies:
                    hint = (" (a rank that dies before it starts is often a script without "
                            "`if __name__ == \"__main__\":`: each spawned rank re-imports it)")
                self._fail(f"while {what}: " + "; ".join(dead) + hint)
        if pending and settle_by is None:
            counts = list(self._progress)
            stuck = laggards(counts, sorted(pending))
            self._fail(f"while {what}: no answer within {timeout_s:g} s "
                       f"(distributed_timeout_s) from rank(s) {sorted(pending)}; "
                       + ", ".join(f"rank {r} (pid {self._procs[r].pid})" for r in stuck)
                       + f" stopped first (collectives entered per rank: {counts})")
        for rank in pending:  # failed ranks left their peers waiting in a collective
            replies[rank] = ("error", "no answer (its peers failed mid-step)")
        return replies

    def _death_message(self, rank: int) -> Optional[str]:
        proc = self._procs[rank]
        code = proc.exitcode
        if code is None:
            return None
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"rank {rank} (pid {proc.pid}) died ({how})"

    def _fail(self, message: str) -> None:
        self._dead = f"tensor-parallel executor: {message}; the engine cannot run more steps"
        self._kill_all()
        raise ExecutorDeadError(self._dead)

    def _kill_all(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(_EXIT_WAIT_S)
        for conn in self._conns:
            conn.close()
        self._conns = []  # later sends fail fast

    def set_kv_tier(self, tier) -> None:
        raise ValueError("persistence is not supported with tensor_parallel_size > 1")

    def shutdown(self) -> None:
        if self._dead is None and self._conns:
            data = pickle.dumps(("shutdown", None), protocol=5)
            for conn in self._conns:
                try:
                    conn.send_bytes(data)
                except OSError:
                    pass
            deadline = time.monotonic() + _EXIT_WAIT_S
            for proc in self._procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        self._dead = self._dead or "tensor-parallel executor: shut down"
        self._kill_all()

    @property
    def device_description(self) -> str:
        return f"{self._device} x{self.world_size} (tensor parallel, mp), {self._dtype}"
