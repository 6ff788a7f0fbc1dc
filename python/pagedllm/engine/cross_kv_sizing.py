"""Sizing the two KV pools of an Mllama model: self-attention layers and cross-attention layers.

The cross-attention layers' K/V (vision tokens, written once per request) live in a pool of
their own, whose blocks hold only those layers; the self pool's blocks hold only the
self-attention layers, so neither wastes slots on the other's layers. The split:

- `num_cross_kv_blocks` given: the cross pool has exactly that many blocks; the usual options
  (num_kv_blocks / kv_cache_memory_bytes) size the self pool alone.
- else, with `num_kv_blocks` given: the self pool has exactly that many, and the cross pool
  gets cross_kv_fraction of the total (self bytes / (1 - fraction) * fraction).
- else: the byte budget the usual sizing would give a text model (plan_kv_pool) is split:
  cross_kv_fraction of it for the cross pool, the rest for the self pool.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from pagedllm.config import EngineConfig
from pagedllm.engine.kv_sizing import KVPlan, plan_kv_pool


def plan_mllama_pools(config: EngineConfig, self_bytes_per_block: int,
                      cross_bytes_per_block: int, model_max_len: int,
                      device_budget_bytes: Optional[int], block_size: int) -> Tuple[KVPlan, int]:
    """The self pool's plan and the cross pool's block count (see the module docstring).

    Args:
        config: the engine options.
        self_bytes_per_block, cross_bytes_per_block: one block of each pool, in bytes.
        model_max_len: the model's max_position_embeddings.
        device_budget_bytes: a GPU's free KV memory (None: the configured or default budget).
        block_size: the resolved block size.
    Returns:
        (self pool KVPlan, cross pool blocks >= 1).
    Raises:
        ValueError: a budget whose cross share holds no block (names the options).
    """
    full = plan_kv_pool(config, self_bytes_per_block, model_max_len, device_budget_bytes,
                        block_size)
    if config.num_cross_kv_blocks is not None:
        return full, config.num_cross_kv_blocks
    f = config.cross_kv_fraction
    total = full.num_blocks * self_bytes_per_block
    if config.num_kv_blocks is not None:
        plan, cross_bytes = full, int(total * f / (1.0 - f))
    else:
        plan = plan_kv_pool(dataclasses.replace(config, kv_cache_memory_bytes=int(total * (1 - f))),
                            self_bytes_per_block, model_max_len, None, block_size)
        cross_bytes = int(total * f)
    num_cross = cross_bytes // cross_bytes_per_block
    if num_cross < 1:
        raise ValueError(f"cross_kv_fraction = {f} of {total} KV bytes holds no cross-attention "
                         f"block ({cross_bytes_per_block} bytes each): raise cross_kv_fraction "
                         f"or kv_cache_memory_bytes, or set num_cross_kv_blocks")
    return plan, num_cross
