"""Sizing the KV pool from a byte budget, with messages that say what fits and what to change."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from pagedllm.config import DEFAULT_KV_CACHE_MEMORY_BYTES, EngineConfig

logger = logging.getLogger("pagedllm")


@dataclass
class KVPlan:
    """The pool the engine will build.

    Attributes:
        num_blocks: blocks in the pool.
        bytes_per_block: bytes of one block across all layers (keys and values).
        max_model_len: the longest sequence the engine will accept.
        watermark_blocks: blocks kept free when admitting new requests.
        block_size: tokens per block.
        sized_by_blocks: num_kv_blocks set the pool (kv_cache_memory_bytes is then ignored,
            so advice names num_kv_blocks only).
    """

    num_blocks: int
    bytes_per_block: int
    max_model_len: int
    watermark_blocks: int
    block_size: int
    sized_by_blocks: bool = False


def watermark_block_count(watermark: float, num_blocks: int) -> int:
    """Blocks a pool of `num_blocks` keeps free when admitting: int(watermark * num_blocks),
    at most num_blocks - 1 (so one block stays admissible)."""
    return min(int(watermark * num_blocks), num_blocks - 1)


# Block sizes the kernels support (paged attention, cache writes: any size in this range).
KERNEL_BLOCK_SIZES = (1, 256)
# block_size="auto" on a GPU: the largest block size measured to pay off per architecture
# (compute capability major.minor -> block size). Empty: pagedllm has not measured it on any
# GPU yet (the seed's A100 64 / H100 128 / 32 are not copied here as if they had been); with
# no entry the rule's value is used as is, bounded by the kernels only.
GPU_BLOCK_SIZE_TABLE: Dict[str, int] = {}


def seed_rule(mean_seq_len: float) -> int:
    """The seed's rule: max(16, 2^ceil(log2(mean sequence length / 10)))."""
    x = max(float(mean_seq_len) / 10.0, 1.0)
    return max(16, 2 ** math.ceil(math.log2(x)))


def resolve_block_size(config: EngineConfig, model_max_len: int,
                       gpu_arch: Optional[str] = None) -> Tuple[int, str]:
    """The block size the pool gets, and why.

    Args:
        config: the options; block_size an int (used as is) or "auto".
        model_max_len: the model's max_position_embeddings (the proxy for the mean sequence
            length when neither expected_mean_seq_len nor max_model_len is given).
        gpu_arch: "major.minor" compute capability on a GPU, None on the CPU.
    Returns:
        (block size, reason for the log and kv_cache_stats()).
    """
    if config.block_size != "auto":
        return int(config.block_size), "configured"
    if config.expected_mean_seq_len is not None:
        mean = config.expected_mean_seq_len
        source = f"expected_mean_seq_len={mean}"
    else:
        mean = config.max_model_len or model_max_len
        source = (f"no expected_mean_seq_len given: max_model_len={mean} taken as a conservative "
                  f"proxy for the mean sequence length (declare expected_mean_seq_len for a "
                  f"better fit)")
    bs = seed_rule(mean)
    why = f"block_size=auto: max(16, 2^ceil(log2({mean} / 10))) = {bs} ({source})"
    lo, hi = KERNEL_BLOCK_SIZES
    if not lo <= bs <= hi:
        bs = min(max(bs, lo), hi)
        why += f"; bounded to {bs} by the kernels' range [{lo}, {hi}]"
    if gpu_arch is not None:
        cap = GPU_BLOCK_SIZE_TABLE.get(gpu_arch)
        if cap is None:
            why += f"; no measured GPU table entry for sm {gpu_arch} (none measured yet)"
        elif bs > cap:
            bs = cap
            why += f"; capped to {cap} by the measured table for sm {gpu_arch}"
    return bs, why


def plan_kv_pool(config: EngineConfig, bytes_per_block: int, model_max_len: int,
                 device_budget_bytes: Optional[int] = None,
                 block_size: Optional[int] = None) -> KVPlan:
    """Decides the number of blocks and the length limit.

    Args:
        config: the engine options (block_size, num_kv_blocks / kv_cache_memory_bytes,
            max_model_len, max_num_seqs, watermark). With neither budget given the pool gets
            2 GiB, or what max_num_seqs sequences of max_model_len tokens need if less.
        bytes_per_block: bytes one block takes (from PagedKVCache.bytes_per_block).
        model_max_len: the model's max_position_embeddings.
        device_budget_bytes: on a GPU, what the device's free memory allows (used instead of
            the 2 GiB default when no budget is configured).
        block_size: the resolved block size (resolve_block_size); None: config.block_size,
            which must then be an int.
    Returns:
        The plan.
    Raises:
        ValueError: the budget holds less than one sequence of the requested length; the
            message gives the tokens that fit and the knob to turn.
    """
    bs = int(config.block_size if block_size is None else block_size)
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
        budget_desc = f"num_kv_blocks={num_blocks}"
    else:
        budget = config.kv_cache_memory_bytes
        if budget is None:
            # Default: 2 GiB, or less when that is more than max_num_seqs full-length sequences
            # could ever use (a small model would otherwise get a needlessly huge pool).
            longest = config.max_model_len or model_max_len
            useful = -(-config.max_num_seqs * longest // bs) * bytes_per_block
            default = (DEFAULT_KV_CACHE_MEMORY_BYTES if device_budget_bytes is None
                       else device_budget_bytes)
            budget = min(default, useful)
        num_blocks = budget // bytes_per_block
        budget_desc = f"kv_cache_memory_bytes={budget} ({bytes_per_block} bytes per block of {bs} tokens)"
        if num_blocks < 1:
            smaller = ""  # a smaller block helps only if one token's K/V fits the budget
            if budget * bs >= bytes_per_block and bs > 1:
                smaller = f", or lower block_size (to {max(1, budget * bs // bytes_per_block)} or less)"
            raise ValueError(
                f"the KV cache budget {budget_desc} holds no block at all; raise "
                f"kv_cache_memory_bytes to at least {bytes_per_block} (one block){smaller}")
    watermark_blocks = watermark_block_count(config.watermark, num_blocks)
    capacity = num_blocks * bs
    usable = (num_blocks - watermark_blocks) * bs  # what one admitted prompt may take
    sparse = config.sparse_attention
    if sparse is not None and sparse.strategy == "streaming":
        # streaming frees the blocks that leave its window: a sequence's length is not
        # bounded by the pool (its prompt still is, being prefilled densely)
        capacity = max(capacity, model_max_len)
    if config.max_model_len is not None:
        if config.max_model_len > model_max_len:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's "
                f"max_position_embeddings={model_max_len}")
        if config.max_model_len > capacity:
            need = -(-config.max_model_len // bs)
            # num_kv_blocks wins over kv_cache_memory_bytes: a larger byte budget would not help
            raise_to = (f"Raise num_kv_blocks to at least {need}" if config.num_kv_blocks is not None
                        else f"Raise kv_cache_memory_bytes (to at least {need * bytes_per_block}) "
                             f"or set num_kv_blocks (to at least {need})")
            raise ValueError(
                f"max_model_len={config.max_model_len} does not fit the KV cache: {budget_desc} "
                f"gives {num_blocks} blocks = {capacity} tokens, and one sequence of "
                f"{config.max_model_len} tokens needs {need} blocks. {raise_to}, or lower "
                f"max_model_len to {capacity} or less")
        max_model_len = config.max_model_len
    else:
        max_model_len = min(model_max_len, capacity)
        if max_model_len < model_max_len:
            logger.warning(
                "KV cache %s holds %d tokens, less than the model's %d positions: max_model_len "
                "set to %d (raise %s for longer sequences)", budget_desc, capacity,
                model_max_len, max_model_len,
                "num_kv_blocks" if config.num_kv_blocks is not None
                else "kv_cache_memory_bytes or num_kv_blocks")
    if usable < 2:
        raise ValueError(
            f"the KV cache ({budget_desc}: {num_blocks} blocks of {bs} tokens, {watermark_blocks} "
            f"kept free as watermark) cannot admit even a 2-token prompt; raise "
            f"kv_cache_memory_bytes or num_kv_blocks, or lower watermark")
    return KVPlan(num_blocks, bytes_per_block, max_model_len, watermark_blocks, bs,
                  config.num_kv_blocks is not None)
