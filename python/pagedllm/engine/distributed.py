"""What a tensor-parallel worker process shares with its peers: the torch.distributed group,
the collectives the sharded model calls, the step as it travels, and the parent-death watch.

`StepInputs` is the part of a SchedulerOutput a worker reads (numpy arrays and the transfer
plan, no Request or Sequence object): the driver pickles it once per step and sends the same
bytes to every rank. `TorchDistComm` implements model.tensor_parallel.Comm over a process group
(gloo on the CPU, nccl on GPUs) and counts the collectives each rank has entered in a shared
progress array, so that a driver waiting on a hung step can name the rank that stopped.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from pagedllm.engine.transfer_plan import KVTransferPlan
from pagedllm.model.tensor_parallel import TPShard

# How often a worker checks that the process that started it still exists.
PARENT_POLL_S = 0.25


@dataclass
class StepInputs:
    """One step as the workers see it (the fields of SchedulerOutput the worker reads; see
    there for their meaning and shapes)."""

    num_decode_seqs: int
    input_ids: np.ndarray        # int64 [num_tokens]
    positions: np.ndarray        # int64 [num_tokens]
    slot_mapping: np.ndarray     # int64 [num_tokens]
    block_tables: np.ndarray     # int32 [num_seqs, max_blocks]
    context_lens: np.ndarray     # int32 [num_seqs]
    cu_seqlens_q: np.ndarray     # int32 [num_seqs + 1]
    logits_indices: np.ndarray   # int64 [num_sampled]
    prompt_logit_spans: List[Tuple[int, int, int]]
    transfer: KVTransferPlan
    multimodal: Optional[Any] = None  # StepMultiModal; None (TP refuses multimodal models)
    sparse: Optional[Any] = None      # SparsePlan: the decode rows' block lists (None: dense)
    cross: Optional[Any] = None       # StepCross; None (TP refuses Mllama models)

    @classmethod
    def of(cls, out) -> "StepInputs":
        """The worker's part of a SchedulerOutput."""
        return cls(out.num_decode_seqs, out.input_ids, out.positions, out.slot_mapping,
                   out.block_tables, out.context_lens, out.cu_seqlens_q, out.logits_indices,
                   list(out.prompt_logit_spans), out.transfer, out.multimodal, out.sparse,
                   out.cross)


class TorchDistComm:
    """model.tensor_parallel.Comm over the default torch.distributed process group.

    Args:
        shard: this rank and the group size.
        device: where the model's tensors live (the collectives run there).
        progress: a shared int64 array with one slot per rank (this rank's count of entered
            collectives is written to progress[rank]); None: not counted.
    """

    def __init__(self, shard: TPShard, device: torch.device,
                 progress: Optional[Sequence[int]] = None):
        self.rank, self.world_size = shard.rank, shard.world_size
        self.device = device
        self._progress = progress
        self.num_collectives = 0

    def _enter(self) -> None:
        self.num_collectives += 1
        if self._progress is not None:
            self._progress[self.rank] = self.num_collectives

    def all_reduce(self, t: torch.Tensor) -> None:
        """Sums t over the ranks, in place."""
        self._enter()
        dist.all_reduce(t)

    def gather_last_dim(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """Rank 0: the ranks' t [n, k] concatenated to [n, world_size * k]; others: None."""
        self._enter()
        t = t.contiguous()
        if self.rank != 0:
            dist.gather(t, None, dst=0)
            return None
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.gather(t, parts, dst=0)
        return torch.cat(parts, dim=-1)

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's value (e.g. the KV blocks each device can hold)."""
        self._enter()
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


@dataclass
class ParallelContext:
    """What a Worker needs to be one rank of a tensor-parallel group.

    Attributes:
        shard: its rank and the group size.
        comm: the group's collectives.
        device_index: the GPU this rank uses when the device is CUDA (its local rank).
    """

    shard: TPShard
    comm: TorchDistComm
    device_index: int = 0


def backend_for(device_type: str) -> str:
    """The torch.distributed backend of a device type: nccl on GPUs, gloo on the CPU."""
    return "nccl" if device_type == "cuda" else "gloo"


def init_process_group(rank: int, world_size: int, init_method: str, backend: str,
                       timeout_s: float) -> None:
    """Joins the group; collectives time out after timeout_s (a dead or hung peer)."""
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def set_worker_threads(num_threads: Optional[int], world_size: int) -> int:
    """Sets torch's (and the kernels') thread count for one rank: num_threads, or this
    machine's cores shared evenly by the ranks. Returns the count."""
    from pagedllm import threads

    return threads.set_num_threads(num_threads or max(1, len(os.sched_getaffinity(0)) // world_size))


def watch_parent(parent_pid: int, poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """Exits this process (at once, code 1) when `parent_pid` is no longer its parent: a worker
    never outlives its driver, even one blocked in a collective."""

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(poll_s)

    t = threading.Thread(target=watch, name="pagedllm-parent-watch", daemon=True)
    t.start()
    return t
