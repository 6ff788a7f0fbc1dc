"""Runs a step's KVTransferPlan on the worker's pools, around the forward.

Order (see transfer_plan.py): before the forward, swap-outs, swap-ins, loads, copy-on-write
copies; after it, stores. What may overlap with the forward:

- CPU: a transfer thread. Swap-outs whose device blocks this step does not write (no slot,
  copy or swap-in destination in them) run on it while the forward computes; otherwise they run
  first. Swap-ins, loads and copies finish before the forward (it reads them). Stores run on the
  thread after the forward and overlap the engine's sampling and the next schedule; the next
  step joins the thread before it touches any block.
- CUDA: a `_core.cuda.Streams` pair. Swaps are queued on the copy stream after a ticket of the
  compute work that wrote the blocks, and the compute stream waits (on the device, no host
  sync) for the tickets it depends on. Loads copy staged host bytes into their blocks before the
  forward; stores wait for the step's compute on the host (the one sync of this path; a
  copy-stream store pipeline is not built yet).

A persistent tier plugs in as `source` (loads: key -> bytes into a block) and `sink` (stores:
block -> key); without one, a plan with loads or stores is an error.
"""

from __future__ import annotations

import concurrent.futures
from time import perf_counter_ns
from typing import Callable, List, Optional

import numpy as np
import torch

from pagedllm.engine.host_swap import HostSwapPool
from pagedllm.engine.tracing import NULL_RECORDER
from pagedllm.engine.transfer_plan import KVTransferPlan, copy_waves
from pagedllm.model import PagedKVCache

# (key, block tensor view) -> fills the block; (block tensor view, key) -> persists it
BlockSource = Callable[[bytes, torch.Tensor], None]
BlockSink = Callable[[torch.Tensor, bytes], None]


class KVTransferEngine:
    """Executes transfer plans for one worker (not thread-safe: the worker thread calls it).

    Args:
        kv_cache: the device pool.
        host_pool: the host swap pool (None: a plan with swaps is an error).
        streams: a `_core.cuda.Streams` when the pool is on a GPU.
        source, sink: the persistent tier's load and store functions (None: none).
    """

    def __init__(self, kv_cache: PagedKVCache, host_pool: Optional[HostSwapPool] = None,
                 streams=None, source: Optional[BlockSource] = None,
                 sink: Optional[BlockSink] = None):
        self.kv_cache = kv_cache
        self.host_pool = host_pool
        self.streams = streams
        self.source = source
        self.sink = sink
        self._thread = (concurrent.futures.ThreadPoolExecutor(1, "pagedllm-kv-transfer")
                        if streams is None else None)
        self._pending: List[concurrent.futures.Future] = []
        self._device_ticket = 0  # CUDA: copies the next compute must wait for
        self.num_overlapped_swap_outs = 0
        self.events: List[tuple] = []  # (what, n) in execution order, for tests
        self.record_events = False
        self.recorder = NULL_RECORDER  # trace spans kv.<what> (Worker.set_tracing)

    # --- before / after the forward -----------------------------------------------------------
    def before_forward(self, plan: KVTransferPlan, written_blocks: np.ndarray) -> None:
        """Runs the plan's pre-forward moves.

        Args:
            plan: the step's plan.
            written_blocks: int64 [m], device blocks this step's forward writes (slots' blocks).
        """
        self.join()
        if not plan.has_pre_forward:
            return
        self._check(plan)
        if self.streams is not None:
            self._before_cuda(plan)
            return
        swap_out = plan.swap_out
        if len(swap_out):
            busy = np.concatenate([written_blocks.astype(np.int64), plan.copies[:, 1],
                                   plan.swap_in[:, 1]])
            if np.isin(swap_out[:, 0], busy).any():
                self._note("swap_out", len(swap_out))
                with self.recorder.span("kv.swap_out", {"blocks": len(swap_out)}, "transfer"):
                    self.host_pool.swap_out(swap_out)
            else:  # nothing this step writes is read: copy while the forward computes
                self.num_overlapped_swap_outs += 1
                self._note("swap_out_async", len(swap_out))
                self._pending.append(self._thread.submit(self._swap_out_async, swap_out))
        if len(plan.swap_in):
            self._note("swap_in", len(plan.swap_in))
            with self.recorder.span("kv.swap_in", {"blocks": len(plan.swap_in)}, "transfer"):
                self.host_pool.swap_in(plan.swap_in)
        self._run_loads(plan)
        self._run_copies(plan)

    def after_forward(self, plan: KVTransferPlan) -> None:
        """Queues the plan's stores (they read blocks the forward just wrote)."""
        if not plan.stores:
            return
        self._check(plan)
        self._note("store", len(plan.stores))
        if self.streams is not None:
            # The stores read what the compute stream wrote: order them after it.
            self.streams.copy_wait(self.streams.record_compute())
            torch.cuda.current_stream().synchronize()
            self._run_stores(plan.stores)
            return
        self._pending.append(self._thread.submit(self._run_stores, list(plan.stores)))

    def join(self) -> None:
        """Waits for queued transfers (re-raises their errors)."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()
        if self.streams is not None and self._device_ticket:
            self.streams.compute_wait(self._device_ticket)
            self._device_ticket = 0

    def shutdown(self) -> None:
        """Finishes queued transfers and stops the transfer thread."""
        self.join()
        if self._thread is not None:
            self._thread.shutdown(wait=True)

    # --- pieces -------------------------------------------------------------------------------
    def _check(self, plan: KVTransferPlan) -> None:
        if (len(plan.swap_out) or len(plan.swap_in)) and self.host_pool is None:
            raise RuntimeError("the transfer plan swaps blocks but the worker has no host swap "
                               "pool (swap_space is 0)")
        if plan.loads and self.source is None:
            raise RuntimeError("the transfer plan loads blocks but no persistent tier is set")
        if plan.stores and self.sink is None:
            raise RuntimeError("the transfer plan stores blocks but no persistent tier is set")

    def _before_cuda(self, plan: KVTransferPlan) -> None:
        s = self.streams
        after = s.record_compute()  # the compute that wrote the victims' blocks
        ticket = 0
        # Spans here time the host side: queueing the copies on the copy stream.
        if len(plan.swap_out):
            self._note("swap_out", len(plan.swap_out))
            with self.recorder.span("kv.swap_out", {"blocks": len(plan.swap_out)}, "transfer"):
                ticket = self.host_pool.swap_out(plan.swap_out, after)
        if len(plan.swap_in):
            self._note("swap_in", len(plan.swap_in))
            # After the swap-outs (a block freed by one may be the target of another).
            with self.recorder.span("kv.swap_in", {"blocks": len(plan.swap_in)}, "transfer"):
                ticket = self.host_pool.swap_in(plan.swap_in, ticket or after)
        if ticket:
            s.compute_wait(ticket)  # on the device: the forward reads / overwrites those blocks
        self._run_loads(plan)
        self._run_copies(plan)

    def _run_copies(self, plan: KVTransferPlan) -> None:
        if not len(plan.copies):
            return
        self._note("copy", len(plan.copies))
        with self.recorder.span("kv.copy", {"blocks": len(plan.copies)}, "transfer"):
            for wave in copy_waves(plan.copies):
                self.kv_cache.copy_blocks(torch.from_numpy(np.ascontiguousarray(wave)))

    def _run_loads(self, plan: KVTransferPlan) -> None:
        if not plan.loads:
            return
        self._note("load", len(plan.loads))
        with self.recorder.span("kv.load", {"blocks": len(plan.loads)}, "transfer"):
            for key, block in plan.loads:
                self.source(key, self.kv_cache.pool[block])

    def _run_stores(self, stores) -> None:
        with self.recorder.span("kv.store", {"blocks": len(stores)}, "transfer"):
            for block, key in stores:
                self.sink(self.kv_cache.pool[block], key)

    def _swap_out_async(self, pairs: np.ndarray) -> None:
        # On the transfer thread (CPU only): a bare span; the recorder's NVTX depth belongs to
        # the step's thread.
        t0 = perf_counter_ns()
        self.host_pool.swap_out(pairs)
        self.recorder.add("kv.swap_out", t0, perf_counter_ns(), {"blocks": len(pairs)},
                          "transfer")

    def _note(self, what: str, n: int) -> None:
        if self.record_events:
            self.events.append((what, n))
