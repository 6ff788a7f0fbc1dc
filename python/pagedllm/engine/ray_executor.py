"""RayExecutor: the tensor-parallel ranks as Ray actors, on the hosts of a Ray cluster.

    driver                                   Ray cluster (ray start --head / --address=...)
    ------                                   ----------------------------------------------
    ray.init() (RAY_ADDRESS, a running       placement group: tensor_parallel_size bundles
      cluster, or a new local one)             ({"GPU": 1} each on CUDA, {"CPU": n} on the CPU)
    ray.put(StepInputs) once per step  --->  actor r (bundle r): TPRank.execute (torch.distributed
    ray.wait on every rank's reply     <---    among the actors, rendezvous at rank 0's node)

The same Executor interface and the same reply rules as the multiprocessing executor
(tp_driver.merge_replies); the actors are threaded (max_concurrency 2) so that, while a step
hangs, the driver can still ask each rank how many collectives it has entered and name the
one that stopped. An actor that dies (its host or process gone) shows as a RayActorError on its
reply: the executor names the rank, kills the other actors, frees the placement group and
raises ExecutorDeadError. Every host needs pagedllm installed and the checkpoint at the same
path.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from typing import Dict, List, Optional

from pagedllm.config import EngineConfig
from pagedllm.engine.distributed import StepInputs
from pagedllm.engine.executor import Executor, ExecutorDeadError
from pagedllm.engine.mp_executor import START_TIMEOUT_S
from pagedllm.engine.model_runner import ModelOutput
from pagedllm.engine.scheduler import SchedulerOutput
from pagedllm.engine.tp_driver import laggards, merge_replies, startup_error
from pagedllm.engine.tp_worker import Reply, error_reply

logger = logging.getLogger("pagedllm")

_SETTLE_S = 1.0  # as MultiprocExecutor: after one rank fails, how long the others may take
_PROGRESS_WAIT_S = 2.0


class RankActor:
    """The body of one Ray actor: a TPRank built on request (see tp_worker.TPRank)."""

    def __init__(self) -> None:
        self.rank = None
        self.progress: List[int] = []

    def pid(self) -> int:
        """This actor's process id (tests kill it)."""
        return os.getpid()

    def rendezvous(self) -> str:
        """A tcp:// address on this actor's node with a free port (rank 0 hosts the group)."""
        import ray

        from pagedllm.engine.mp_executor import free_port

        return f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"

    def start(self, rank: int, world_size: int, init_method: str, config: EngineConfig,
              model_path: str) -> Reply:
        """Joins the group and loads this rank's shard; ("ok", hello) or an error reply."""
        from pagedllm.engine.tp_worker import TPRank

        self.progress = [0] * world_size
        try:
            # Ray makes the actor's GPU device 0 (CUDA_VISIBLE_DEVICES).
            self.rank = TPRank(rank, world_size, init_method, config, model_path, 0,
                               self.progress)
            return "ok", self.rank.hello()
        except BaseException as e:  # noqa: BLE001 - the driver names the rank
            return error_reply(e)

    def execute(self, data: bytes) -> Reply:
        """One step (pickled StepInputs); as TPRank.execute."""
        return self.rank.execute(pickle.loads(data))

    def collectives_entered(self) -> int:
        """How many collectives this rank has entered (answers while a step runs)."""
        return max(self.progress) if self.progress else 0

    def shutdown(self) -> None:
        """Leaves the group."""
        if self.rank is not None:
            self.rank.shutdown()


class RayExecutor(Executor):
    """tensor_parallel_size ranks as Ray actors placed by one placement group.

    Args:
        config: the engine options (tensor_parallel_size, distributed_timeout_s, num_threads:
            CPUs per rank on a CPU cluster, default 1).
        model_path: the checkpoint directory (the same path on every host).
    Raises:
        ValueError: the cluster cannot place the ranks within distributed_timeout_s, or a
            config error every rank reports.
        ExecutorDeadError: a rank died or failed while loading.
    """

    def __init__(self, config: EngineConfig, model_path: str):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        self.world_size = config.tensor_parallel_size
        self.timeout_s = float(config.distributed_timeout_s)
        self._dead: Optional[str] = None
        if not ray.is_initialized():
            ray.init(log_to_driver=False)  # RAY_ADDRESS, a `ray start` cluster, or a new one
        on_gpu = config.device.startswith("cuda")
        cpus = config.num_threads or 1
        bundle = {"GPU": 1, "CPU": 1} if on_gpu else {"CPU": cpus}
        self._pg = placement_group([dict(bundle) for _ in range(self.world_size)],
                                   strategy="PACK")
        try:
            ray.get(self._pg.ready(), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self._pg)
            raise ValueError(
                f"tensor_parallel_size={self.world_size}: the Ray cluster cannot place "
                f"{self.world_size} bundles of {bundle} within {self.timeout_s:g} s "
                f"(available: {ray.available_resources()})") from None
        actor_cls = ray.remote(RankActor)
        self._actors = [
            actor_cls.options(
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), max_concurrency=2,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=rank),
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(cpus)}}).remote()
            for rank in range(self.world_size)]
        init_method = ray.get(self._actors[0].rendezvous.remote(),
                              timeout=max(self.timeout_s, START_TIMEOUT_S))
        refs = [a.start.remote(r, self.world_size, init_method, config, model_path)
                for r, a in enumerate(self._actors)]
        replies = self._collect(refs, "loading the model", max(self.timeout_s, START_TIMEOUT_S))
        error = startup_error(replies)
        if error is not None:
            self._kill_all()
            raise error
        self.model_config, self.layout, self._device, self._dtype = replies[0][1]
        self.worker_pids = ray.get([a.pid.remote() for a in self._actors])
        logger.info("tensor parallel over Ray: %d ranks (pids %s) on %s, %s", self.world_size,
                    self.worker_pids, self._device, self._dtype)

    def execute_model(self, out: SchedulerOutput) -> ModelOutput:
        if self._dead is not None:
            raise ExecutorDeadError(self._dead)
        data = self._ray.put(pickle.dumps(StepInputs.of(out), protocol=5))
        replies = self._collect([a.execute.remote(data) for a in self._actors], "a step",
                                self.timeout_s)
        try:
            return merge_replies(replies)
        except ExecutorDeadError as e:
            self._fail(str(e))

    def _collect(self, refs: list, what: str, timeout_s: float) -> Dict[int, Reply]:
        """Every rank's reply to `refs` (rank order) within timeout_s, or ExecutorDeadError
        naming the ranks."""
        ray = self._ray
        rank_of = {ref: r for r, ref in enumerate(refs)}
        replies: Dict[int, Reply] = {}
        pending = list(refs)
        deadline = time.monotonic() + timeout_s
        settle_by: Optional[float] = None
        while pending:
            until = deadline if settle_by is None else min(deadline, settle_by)
            left = until - time.monotonic()
            if left <= 0:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in ready:
                rank = rank_of[ref]
                try:
                    replies[rank] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    self._fail(f"while {what}: rank {rank} (its Ray actor) died "
                               f"({type(e).__name__})")
                except ray.exceptions.RayError as e:
                    replies[rank] = ("error", f"{type(e).__name__}: {e}")
                if replies[rank][0] != "ok" and settle_by is None:
                    settle_by = time.monotonic() + _SETTLE_S
        left_over = sorted(rank_of[ref] for ref in pending)
        if left_over and settle_by is None:
            counts = self._progress()
            silent = [r for r, c in enumerate(counts) if c is None]
            if silent:  # a rank that cannot even say how far it got: stopped or gone
                stuck = silent
            else:
                stuck = laggards(counts, left_over)
            self._fail(f"while {what}: no answer within {timeout_s:g} s "
                       f"(distributed_timeout_s) from rank(s) {left_over}; rank(s) {stuck} "
                       f"stopped first (collectives entered per rank: {counts})")
        for rank in left_over:
            replies[rank] = ("error", "no answer (its peers failed mid-step)")
        return replies

    def _progress(self) -> List[Optional[int]]:
        """Each rank's collectives entered (None for a rank that does not answer quickly)."""
        ray = self._ray
        refs = [a.collectives_entered.remote() for a in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_PROGRESS_WAIT_S)
        counts: List[Optional[int]] = []
        for ref in refs:
            try:
                counts.append(ray.get(ref) if ref in ready else None)
            except ray.exceptions.RayError:
                counts.append(None)
        return counts

    def _fail(self, message: str) -> None:
        self._dead = f"tensor-parallel executor (ray): {message}; the engine cannot run more steps"
        self._kill_all()
        raise ExecutorDeadError(self._dead)

    def _kill_all(self) -> None:
        ray = self._ray
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
        if self._pg is not None:
            ray.util.remove_placement_group(self._pg)
            self._pg = None

    def set_kv_tier(self, tier) -> None:
        raise ValueError("persistence is not supported with distributed_executor_backend='ray'")

    def shutdown(self) -> None:
        if self._dead is None and self._actors:
            try:
                self._ray.get([a.shutdown.remote() for a in self._actors], timeout=5.0)
            except self._ray.exceptions.RayError:
                pass
        self._dead = self._dead or "tensor-parallel executor (ray): shut down"
        self._kill_all()

    @property
    def device_description(self) -> str:
        return f"{self._device} x{self.world_size} (tensor parallel, ray), {self._dtype}"
