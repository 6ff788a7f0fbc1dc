"""Worker: owns the device, the model and its dtype, the KV pools and the kernels' inputs.

Built by an Executor from the EngineConfig. It resolves the device ("auto" | "cpu" | "cuda[:N]")
and the dtype, loads the weights there, sizes the KV pool (on a GPU from the memory that the
weights leave under gpu_memory_utilization, unless the config gives a budget), allocates the
device pool and, for preemption by swapping, the host swap pool, then runs steps: the transfer
plan's moves before the forward, the forward (ModelRunner), the plan's stores after it.
Everything that touches a device tensor lives here or below (model, ops, kernels).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from pagedllm.config import EngineConfig
from pagedllm.engine import device as devices
from pagedllm.engine import host_malloc
from pagedllm.engine.cross_kv_sizing import plan_mllama_pools
from pagedllm.engine.host_swap import HostSwapPool
from pagedllm.engine.kv_sizing import KVPlan, plan_kv_pool, resolve_block_size
from pagedllm.engine.kv_transfer import KVTransferEngine
from pagedllm.engine.model_runner import ModelOutput, ModelRunner
from pagedllm.engine.scheduler import SchedulerOutput
from pagedllm.engine.tracing import NULL_RECORDER
from pagedllm.model import PagedKVCache, load_model

if TYPE_CHECKING:
    from pagedllm.engine.distributed import ParallelContext

logger = logging.getLogger("pagedllm")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# headroom kept on a GPU for activations of the largest step (beyond the weights)
_GPU_ACTIVATION_RESERVE = 1 << 30


@dataclass
class KVLayout:
    """What the scheduler needs to know of the pools the worker built.

    Attributes:
        plan: the device pool (blocks, bytes per block, max_model_len, watermark, the
            resolved block size).
        num_host_blocks: blocks in the host swap pool (0: none).
        block_size_reason: why the pool has plan.block_size ("configured", or block_size
            auto's rule and inputs).
        num_cross_blocks: blocks of the cross-attention pool (Mllama; 0: none).
        cross_bytes_per_block: bytes of one of its blocks (its layers only).
    """

    plan: KVPlan
    num_host_blocks: int
    block_size_reason: str = "configured"
    num_cross_blocks: int = 0
    cross_bytes_per_block: int = 0


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The model dtype of a config's `dtype` on a device.

    Raises:
        ValueError: float16 on the CPU (the CPU kernels and oneDNN paths expect fp32 or bf16).
    """
    if name == "auto":
        return devices.model_dtype_for(device)
    dtype = _DTYPES[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise ValueError("dtype='float16' is not supported on the CPU (use float32 or bfloat16, "
                         "or device='cuda')")
    return dtype


class Worker:
    """The device side of the engine (one process, one device).

    Args:
        config: the engine options.
        model_path: the checkpoint directory.
        parallel: this worker's rank of a tensor-parallel group (engine/distributed.py): it
            loads only its shard of the weights and holds only its KV heads of every block.
            None: the whole model.
    Raises:
        ValueError: device="cuda" without a GPU or without the CUDA kernels (names the option),
            or another bad option.
        CheckpointError: a bad checkpoint.
    """

    def __init__(self, config: EngineConfig, model_path: str,
                 parallel: Optional["ParallelContext"] = None):
        try:
            self.device = devices.resolve_device(config.device,
                                                 devices.checkpoint_head_dim(model_path))
        except RuntimeError as e:  # a setting this machine cannot honour: a config error
            raise ValueError(f"device: {e}") from None
        if parallel is not None and self.device.type == "cuda":
            self.device = torch.device("cuda", parallel.device_index)
        self.dtype = resolve_dtype(config.dtype, self.device)
        on_gpu = self.device.type == "cuda"
        if on_gpu:
            torch.cuda.set_device(self.device)
        else:
            host_malloc.keep_freed_memory()  # step tensors reuse memory, not fresh pages
            from pagedllm import _core

            _core.get_cpu_engine()  # a bad PAGEDLLM_CPU_ENGINE: a ValueError now, not at step 1
        prepack = config.prepack_weights and not on_gpu and self.dtype != torch.float16
        if parallel is None:
            model, self.model_config = load_model(model_path, dtype=self.dtype, prepack=prepack)
            pool_config = self.model_config
        else:
            from pagedllm.model.parallel_loader import load_model_shard

            parallel.comm.device = self.device
            model, self.model_config = load_model_shard(model_path, parallel.shard,
                                                        parallel.comm, self.dtype, prepack)
            pool_config = model.config  # this rank's KV heads
        self.model = model.to(self.device) if on_gpu else model

        arch = None
        if on_gpu:
            major, minor = torch.cuda.get_device_capability(self.device)
            arch = f"{major}.{minor}"
        block_size, self.block_size_reason = resolve_block_size(
            config, self.model_config.max_position_embeddings, arch)
        if config.block_size == "auto":
            logger.info("%s", self.block_size_reason)
        sparse = config.sparse_attention
        if sparse is not None:
            sparse.check_block_size(block_size)
        key_bounds = sparse is not None and sparse.strategy == "quest"  # kept beside the pool
        bytes_per_block = PagedKVCache.bytes_per_block(pool_config, block_size,
                                                       config.kv_cache_dtype, self.dtype,
                                                       key_bounds)
        device_budget = None
        if on_gpu and config.num_kv_blocks is None and config.kv_cache_memory_bytes is None:
            device_budget = devices.gpu_kv_budget_bytes(
                self.device, config.gpu_memory_utilization, _GPU_ACTIVATION_RESERVE)
        if parallel is not None and device_budget is not None:
            # one block table for every rank: the device with the least room sizes the pools
            device_budget = parallel.comm.min_over_ranks(device_budget)
        mllama = getattr(model, "mllama_config", None)
        self.cross_kv: Optional[PagedKVCache] = None
        cross_bytes = 0
        if mllama is None:
            plan = plan_kv_pool(config, bytes_per_block,
                                self.model_config.max_position_embeddings, device_budget,
                                block_size)
        else:  # Mllama: the cross-attention layers' pool beside the self-attention one
            if parallel is not None:
                raise ValueError("tensor_parallel_size > 1 is not supported for Mllama models")
            cross_bpb = PagedKVCache.bytes_per_block(mllama.cross_text, block_size,
                                                     config.kv_cache_dtype, self.dtype)
            plan, num_cross = plan_mllama_pools(
                config, bytes_per_block, cross_bpb, self.model_config.max_position_embeddings,
                device_budget, block_size)
            cross_bytes = num_cross * cross_bpb
        num_host_blocks = 0
        self.host_pool = None
        if config.preemption_mode == "swap":
            num_host_blocks = config.swap_space_bytes // bytes_per_block
            if num_host_blocks < 1:
                raise ValueError(
                    f"swap_space={config.swap_space} GiB holds no KV block ({bytes_per_block} "
                    f"bytes each); raise swap_space or use preemption_mode='recompute'")
            # Never more host blocks than the device pool has: a victim's blocks come from it.
            num_host_blocks = min(num_host_blocks, plan.num_blocks)
        # Before any pool is allocated: a pool past the memory left fails here, naming its
        # option, not inside torch's allocator.
        self._check_pools_fit(config, plan, bytes_per_block, num_host_blocks, cross_bytes)
        if mllama is not None:
            self.cross_kv = PagedKVCache(mllama.cross_text, num_cross, plan.block_size,
                                         config.kv_cache_dtype, config.k_scale, config.v_scale,
                                         dtype=self.dtype, device=self.device)
        self.kv_cache = PagedKVCache(pool_config, plan.num_blocks, plan.block_size,
                                     config.kv_cache_dtype, config.k_scale, config.v_scale,
                                     dtype=self.dtype, device=self.device,
                                     key_bounds=key_bounds)
        self.streams = None
        if on_gpu:
            from pagedllm import _core

            self.streams = _core.cuda.Streams(self.device.index or 0,
                                              torch.cuda.current_stream(self.device).cuda_stream)
            # Kernels record bad device-side values instead of waiting after each call; the
            # step checks once, after its logits reach the host (which waits anyway).
            _core.cuda.set_validation("deferred")
        if num_host_blocks:
            self.host_pool = HostSwapPool(self.kv_cache.pool, num_host_blocks, self.streams)
        cross = self.cross_kv
        self.layout = KVLayout(plan, num_host_blocks, self.block_size_reason,
                               cross.num_blocks if cross is not None else 0,
                               cross.nbytes // cross.num_blocks if cross is not None else 0)
        self.transfer = KVTransferEngine(self.kv_cache, self.host_pool, self.streams)
        self.model_runner = ModelRunner(self.model, self.kv_cache,
                                        check_numerics=config.check_numerics != "off",
                                        cross_kv=self.cross_kv)
        logger.info("worker: %s, %s weights, %d KV blocks of %d tokens (%.1f MiB)%s",
                    self.device, str(self.dtype).replace("torch.", ""), plan.num_blocks,
                    plan.block_size, plan.num_blocks * bytes_per_block / (1 << 20),
                    f", {num_host_blocks} host swap blocks" if num_host_blocks else "")

    def _check_pools_fit(self, config: EngineConfig, plan: KVPlan, bytes_per_block: int,
                         num_host_blocks: int, cross_bytes: int) -> None:
        """Refuses KV pools larger than the memory left, naming the option that sized them:
        the KV pool with the Mllama cross-attention pool (`cross_bytes`, sized with it), and
        the host swap pool of `num_host_blocks` (beside them on the CPU, on its own on a
        GPU)."""
        pool = plan.num_blocks * bytes_per_block + cross_bytes
        if plan.sized_by_blocks:
            sized, knob = f"num_kv_blocks={config.num_kv_blocks}", "num_kv_blocks"
        elif config.kv_cache_memory_bytes is not None:
            sized = f"kv_cache_memory_bytes={config.kv_cache_memory_bytes}"
            knob = "kv_cache_memory_bytes"
        else:
            sized = "the default budget"
            knob = "kv_cache_memory_bytes or num_kv_blocks"
        what = f"the KV pool ({plan.num_blocks} blocks of {plan.block_size} tokens, {sized})"
        if cross_bytes:
            what = f"{what} with its cross-attention pool"
            knob = f"{knob} (the cross pool: num_cross_kv_blocks or cross_kv_fraction)"
        host = num_host_blocks * bytes_per_block
        swap = f"host swap pool (swap_space={config.swap_space} GiB)"
        if host and self.device.type != "cuda":  # both in host memory
            pool, what, knob = pool + host, f"{what} with its {swap}", f"{knob} or swap_space"
        devices.check_fits(pool, self.device, what, knob)
        if host and self.device.type == "cuda":
            devices.check_fits(host, torch.device("cpu"), f"the {swap}", "swap_space")

    def execute_model(self, out: SchedulerOutput) -> ModelOutput:
        """Runs one step: transfers before, the forward, transfers after.

        Args:
            out: the scheduler's output (arrays and the KV transfer plan).
        Returns:
            The step's logits on the host.
        """
        # the blocks the forward writes matter only to a swap-out (may it overlap the forward?)
        written = (out.slot_mapping // self.kv_cache.block_size if len(out.transfer.swap_out)
                   else out.slot_mapping[:0])
        self.transfer.before_forward(out.transfer, written)
        result = self.model_runner.execute(out)
        self.transfer.after_forward(out.transfer)
        if self.streams is not None:
            self._check_device_errors()
        return result

    def set_tracing(self, recorder, layers: bool) -> None:
        """Records this worker's spans (transfers, inputs, forward, layers, logits) into
        `recorder` (engine/tracing.py); None stops."""
        self.transfer.join()  # transfers in flight (stores) record into the old recorder
        self.transfer.recorder = recorder or NULL_RECORDER
        self.model_runner.set_tracing(recorder, layers)

    def _check_device_errors(self) -> None:
        from pagedllm import _core

        check = getattr(_core.cuda, "check_errors", None)
        if check is not None:
            check()

    def shutdown(self) -> None:
        """Finishes pending transfers."""
        self.transfer.shutdown()
