"""One tensor-parallel rank: a Worker on its shard, and the messages it answers.

Both distributed executors drive ranks through `TPRank` (the multiprocessing one from
`mp_worker_main`, a loop over a pipe; the Ray one from an actor's methods). Per step a rank
runs Worker.execute_model on the StepInputs; rank 0's reply carries the logits (numpy arrays,
which pickle without a copy), the other ranks' only say the step is done. An exception becomes
a reply ("error", "Type: message") so the driver can tell a step every rank refused (bad
inputs, checked before any collective: the group is still in step) from one rank failing.
"""

from __future__ import annotations

import logging
import pickle
import traceback
from typing import Any, Tuple

import numpy as np
import torch

from pagedllm.config import EngineConfig
from pagedllm.engine import distributed
from pagedllm.engine.distributed import ParallelContext, StepInputs, TorchDistComm
from pagedllm.engine.model_runner import ModelOutput
from pagedllm.model.tensor_parallel import TPShard

logger = logging.getLogger("pagedllm")

Reply = Tuple[str, Any]  # ("ok", payload) | ("error", "Type: message")
GROUP_TIMEOUT_S = 600.0


def encode_output(result: ModelOutput) -> tuple:
    """A ModelOutput as numpy arrays (logits float32 [n, vocab] or None, {i: [rows, vocab]}),
    plus its layer_faults (check_numerics: plain lists, or None)."""
    logits = None if result.logits is None else result.logits.numpy()
    return logits, {i: t.numpy() for i, t in result.prompt_logits.items()}, result.layer_faults


def decode_output(data: tuple) -> ModelOutput:
    """encode_output's inverse (tensors share the arrays' memory, unless they are read-only,
    as Ray's zero-copy arrays are: those are copied)."""
    logits, prompt, faults = data

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.require(a, requirements="W"))

    return ModelOutput(None if logits is None else tensor(logits),
                       {i: tensor(a) for i, a in prompt.items()}, faults)


def error_reply(e: BaseException) -> Reply:
    """The reply for a failure: the exception's type and message (traceback logged)."""
    logger.debug("tensor-parallel rank failed:\n%s", traceback.format_exc())
    return "error", f"{type(e).__name__}: {e}"


class TPRank:
    """A Worker as one rank of a tensor-parallel group (joins the group on construction).

    Args:
        rank, world_size: this rank of how many.
        init_method: torch.distributed rendezvous ("tcp://host:port").
        config: the engine options (device, dtype, pool, num_threads, distributed_timeout_s).
        model_path: the checkpoint directory (readable from this rank's host).
        device_index: the GPU of this rank when the device is CUDA.
        progress: shared per-rank collective counters (TorchDistComm), or None.
    """

    def __init__(self, rank: int, world_size: int, init_method: str, config: EngineConfig,
                 model_path: str, device_index: int = 0, progress=None):
        from pagedllm.engine import device as devices
        from pagedllm.engine.worker import Worker

        self.rank = rank
        self.threads = distributed.set_worker_threads(config.num_threads, world_size)
        # The Worker's choice too (the same head_dim rule), so the group's backend matches it.
        device = devices.resolve_device(config.device, devices.checkpoint_head_dim(model_path))
        if device.type == "cuda":  # nccl binds the group to the current device
            torch.cuda.set_device(device_index)
        # The driver enforces distributed_timeout_s on every step; the group's own timeout
        # is only a backstop, long enough for the slowest rank to start.
        distributed.init_process_group(rank, world_size, init_method,
                                       distributed.backend_for(device.type),
                                       max(config.distributed_timeout_s, GROUP_TIMEOUT_S))
        shard = TPShard(rank, world_size)
        comm = TorchDistComm(shard, device, progress)
        self.worker = Worker(config, model_path, ParallelContext(shard, comm, device_index))

    def hello(self) -> tuple:
        """(model_config, layout, device, dtype name) for the driver."""
        w = self.worker
        return w.model_config, w.layout, str(w.device), str(w.dtype).replace("torch.", "")

    def execute(self, step: StepInputs) -> Reply:
        """Runs one step; rank 0's payload is encode_output(...), the others' None."""
        try:
            result = self.worker.execute_model(step)
        except Exception as e:  # noqa: BLE001 - reported to the driver, which decides
            return error_reply(e)
        return "ok", (encode_output(result) if self.rank == 0 else None)

    def shutdown(self) -> None:
        """Finishes pending transfers and leaves the group."""
        self.worker.shutdown()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def mp_worker_main(rank: int, world_size: int, init_method: str, config: EngineConfig,
                   model_path: str, conn, parent_pid: int, progress) -> None:
    """Entry point of a spawned rank: builds a TPRank, then answers the driver's messages on
    `conn` (pickled ("step", StepInputs) | ("shutdown", None)) until shutdown or EOF."""
    distributed.watch_parent(parent_pid)
    try:
        rank_obj = TPRank(rank, world_size, init_method, config, model_path, rank, progress)
        conn.send_bytes(pickle.dumps(("ok", rank_obj.hello()), protocol=5))
    except BaseException as e:  # noqa: BLE001 - the driver reports it, naming this rank
        conn.send_bytes(pickle.dumps(error_reply(e), protocol=5))
        return
    while True:
        try:
            kind, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the driver went away
            break
        if kind == "shutdown":
            break
        conn.send_bytes(pickle.dumps(rank_obj.execute(payload), protocol=5))
    rank_obj.shutdown()  # the driver joins the process
