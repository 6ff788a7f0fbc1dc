"""The host swap pool: host memory shaped like the device pool's blocks (pinned when the device
pool is on a GPU), where preemption by swapping keeps a victim's blocks.

The scheduler owns the host block *ids* (a `_core.BlockAllocator` of the same size) and puts
(device block, host block) pairs into the step's KV transfer plan; this pool only moves bytes.
On a GPU the copies are queued on the copy stream of a `pagedllm._core.cuda.Streams` after a
ticket (the compute work they must follow) and return a ticket the compute stream waits for;
on the CPU they run synchronously (on the worker's transfer thread).
Not thread-safe: one transfer thread or the worker thread uses it at a time.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedllm import ops


class HostSwapPool:
    """Host blocks shaped like the device pool's blocks.

    Args:
        device_pool: the KV pool, [num_blocks, ...] with contiguous blocks.
        num_host_blocks: host blocks to allocate (>= 1).
        streams: a pagedllm._core.cuda.Streams for a GPU pool (None: synchronous copies).
    """

    def __init__(self, device_pool: torch.Tensor, num_host_blocks: int, streams=None):
        if num_host_blocks < 1:
            raise ValueError(f"num_host_blocks must be >= 1, got {num_host_blocks}")
        self.device_pool = device_pool
        pin = device_pool.is_cuda
        # pool: [num_host_blocks, *block_shape] (pinned for asynchronous GPU copies)
        self.pool = torch.zeros((num_host_blocks, *device_pool.shape[1:]),
                                dtype=device_pool.dtype, pin_memory=pin)
        self.streams = streams

    @property
    def num_blocks(self) -> int:
        return int(self.pool.shape[0])

    @property
    def bytes_per_block(self) -> int:
        return self.pool[0].numel() * self.pool.element_size()

    def swap_out(self, pairs: np.ndarray, after: int = 0) -> int:
        """Copies device blocks to host blocks.

        Args:
            pairs: int64 [k, 2] (device block, host block).
            after: a Streams ticket the copies must wait for (the step that wrote the blocks).
        Returns:
            The ticket of the copies (0 when synchronous).
        Raises:
            IndexError / ValueError: an id outside either pool (nothing copied).
        """
        return self._copy(self.device_pool, self.pool, pairs, after)

    def swap_in(self, pairs: np.ndarray, after: int = 0) -> int:
        """Copies host blocks back into device blocks.

        Args:
            pairs: int64 [k, 2] (host block, device block).
            after: a Streams ticket the copies must wait for.
        Returns:
            The ticket the step that reads the device blocks must wait for (0: synchronous).
        """
        return self._copy(self.pool, self.device_pool, pairs, after)

    def _copy(self, src: torch.Tensor, dst: torch.Tensor, pairs: np.ndarray, after: int) -> int:
        if len(pairs) == 0:
            return 0
        mapping = torch.from_numpy(np.ascontiguousarray(pairs, dtype=np.int64))
        if self.streams is not None:
            return self.streams.swap_blocks_async(src, dst, mapping, after)
        ops.swap_blocks(src, dst, mapping)
        return 0
