"""Executor: the engine's one handle on the workers that own the devices.

The engine hands it each step's SchedulerOutput and gets back the step's logits on the host
(ModelOutput); it never sees a device tensor. `UniProcExecutor` runs one Worker in the engine's
own process and thread; MultiprocExecutor (engine/mp_executor.py: tensor-parallel ranks in
spawned processes over torch.distributed) and RayExecutor (engine/ray_executor.py: ranks as Ray
actors, across hosts) implement the same four members.
"""

from __future__ import annotations

import abc

from pagedllm.config import EngineConfig
from pagedllm.engine.model_runner import ModelOutput
from pagedllm.engine.scheduler import SchedulerOutput
from pagedllm.engine.worker import KVLayout, Worker
from pagedllm.model import ModelConfig


class ExecutorDeadError(RuntimeError):
    """The workers cannot run another step (a rank died, hung past distributed_timeout_s, or
    failed alone): the engine stops instead of failing only the step's requests."""


class StepRefusedError(RuntimeError):
    """Every rank refused one step with the same error, whose "Type: message" text this
    carries as it is: that step's requests fail, the engine goes on."""


class Executor(abc.ABC):
    """What the engine needs of the device side."""

    model_config: ModelConfig
    layout: KVLayout

    @abc.abstractmethod
    def execute_model(self, out: SchedulerOutput) -> ModelOutput:
        """Runs one step (transfer plan, forward) and returns its logits on the host."""

    @abc.abstractmethod
    def set_kv_tier(self, tier) -> None:
        """Gives the workers the persistent tier's load/store functions (plan loads/stores)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Releases the workers (pending transfers finish first)."""

    def set_tracing(self, recorder, layers: bool) -> bool:
        """Gives the workers the trace's span recorder (engine/tracing.py; None: stop).

        Args:
            recorder: a SpanRecorder, or None.
            layers: also a span per decoder layer.
        Returns:
            False when the workers cannot record into it (this default: out-of-process
            workers); the trace then holds the engine's spans only.
        """
        return False

    @property
    @abc.abstractmethod
    def device_description(self) -> str:
        """Where the model runs, for logs and stats (e.g. "cpu, float32")."""


class UniProcExecutor(Executor):
    """One Worker in the calling process.

    Args:
        config: the engine options.
        model_path: the checkpoint directory.
    """

    def __init__(self, config: EngineConfig, model_path: str):
        self.worker = Worker(config, model_path)
        self.model_config = self.worker.model_config
        self.layout = self.worker.layout

    def execute_model(self, out: SchedulerOutput) -> ModelOutput:
        return self.worker.execute_model(out)

    def set_kv_tier(self, tier) -> None:
        self.worker.transfer.source = tier.load_into
        self.worker.transfer.sink = tier.store_block

    def set_tracing(self, recorder, layers: bool) -> bool:
        self.worker.set_tracing(recorder, layers)
        return True

    def shutdown(self) -> None:
        self.worker.shutdown()

    @property
    def device_description(self) -> str:
        return f"{self.worker.device}, {str(self.worker.dtype).replace('torch.', '')}"
