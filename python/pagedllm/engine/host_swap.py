"""A host (CPU, pinned when the device pool is on a GPU) copy of the KV pool's block layout, for
preemption by swapping instead of recomputing.

The pool has its own block ids. `swap_out` copies device blocks into freshly taken host blocks,
`swap_in` copies host blocks back into device blocks the KV manager gave, then frees the host
blocks. On a GPU the copies go on the copy stream of a `pagedllm._core.cuda.Streams`, ordered
after the compute work that wrote the blocks (`after` ticket) and returning a ticket the step
that reads them must wait for (`Streams.compute_wait`); on the CPU they are synchronous.
Running out of host blocks is a normal result (None), never an exception.
Not thread-safe: the engine uses it from one thread.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from pagedllm import ops


class HostSwapPool:
    """Host blocks shaped like the device pool's blocks.

    Args:
        device_pool: the KV pool, [num_blocks, ...] with contiguous blocks.
        num_host_blocks: host blocks to allocate.
        streams: a pagedllm._core.cuda.Streams for a GPU pool (None: synchronous copies).
    """

    def __init__(self, device_pool: torch.Tensor, num_host_blocks: int, streams=None):
        if num_host_blocks < 1:
            raise ValueError(f"num_host_blocks must be >= 1, got {num_host_blocks}")
        self.device_pool = device_pool
        pin = device_pool.is_cuda
        # pool: [num_host_blocks, *block_shape] (pinned for asynchronous GPU copies)
        self.pool = torch.empty((num_host_blocks, *device_pool.shape[1:]),
                                dtype=device_pool.dtype, pin_memory=pin)
        self.streams = streams
        self._free = list(range(num_host_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        """Host blocks not holding a swapped-out block."""
        return len(self._free)

    @property
    def bytes_per_block(self) -> int:
        return self.pool[0].numel() * self.pool.element_size()

    def can_swap_out(self, n: int) -> bool:
        """Whether n device blocks fit in the host pool now."""
        return n <= len(self._free)

    def swap_out(self, device_blocks: Sequence[int], after: int = 0
                 ) -> Optional[tuple[list[int], int]]:
        """Copies device blocks to new host blocks.

        Args:
            device_blocks: ids in the device pool.
            after: a Streams ticket the copies must wait for (the step that wrote the blocks).
        Returns:
            (host block ids in the same order, ticket of the copies; 0 when synchronous), or
            None when the host pool lacks room (nothing changes).
        """
        if not self.can_swap_out(len(device_blocks)):
            return None
        host = [self._free.pop() for _ in device_blocks]
        pairs = torch.tensor(list(zip(device_blocks, host)), dtype=torch.int64).view(-1, 2)
        return host, self._copy(self.device_pool, self.pool, pairs, after)

    def swap_in(self, host_blocks: Sequence[int], device_blocks: Sequence[int],
                after: int = 0) -> int:
        """Copies host blocks back into device blocks and frees the host blocks.

        Returns:
            The ticket the step that reads the device blocks must wait for (0: synchronous).
        Raises:
            ValueError: lengths differ, or a host block is not in use.
        """
        if len(host_blocks) != len(device_blocks):
            raise ValueError(f"{len(host_blocks)} host blocks for {len(device_blocks)} device blocks")
        free = set(self._free)
        for b in host_blocks:
            if b in free or not 0 <= b < self.pool.shape[0]:
                raise ValueError(f"host block {b} does not hold a swapped-out block")
        pairs = torch.tensor(list(zip(host_blocks, device_blocks)), dtype=torch.int64).view(-1, 2)
        ticket = self._copy(self.pool, self.device_pool, pairs, after)
        self._free.extend(host_blocks)  # reusable: later copies queue after this one
        return ticket

    def _copy(self, src: torch.Tensor, dst: torch.Tensor, pairs: torch.Tensor, after: int) -> int:
        if len(pairs) == 0:
            return 0
        if self.streams is not None:
            return self.streams.swap_blocks_async(src, dst, pairs, after)
        ops.swap_blocks(src, dst, pairs)
        return 0
