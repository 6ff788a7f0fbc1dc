"""PersistentTier: the disk tier of the KV cache, between the scheduler and the C++ BlockStore.

A full prompt block is identified across restarts by a 128-bit chained content key
(`_core.block_key(parent key, its token ids, extra key)`) and stored with a fingerprint of
everything that shapes its bytes (model config and every byte of the weights: model_fingerprint.py;
model dtype, KV dtype and scales, block size, pool layout), so another model, dtype or layout can
never read it; the store
compares the fingerprint, the block size and the token ids on every load and verifies the
checksum (a mismatch is a miss, and the record is removed).

Reads never stall a step: when the scheduler finds that a waiting prompt's next blocks are on
disk (`lookup`), it asks for them (`prefetch`) and admits the prompt once a reader thread has
verified them into host buffers (`staged`); the worker then copies the staged bytes into the
blocks it was given (`load_into`, the transfer plan's loads, before the forward). Writes never
stall a step either: the worker copies a freshly computed block into a buffer (`store_block`,
the plan's stores, after the forward) and a writer thread puts it to disk; past the queue's
bound a write is dropped and counted. A store that fails (disk full, read-only, gone) is
logged once and the engine keeps serving from memory.

Thread-safety: the scheduler thread and the worker's transfer thread call it; the reader and
writer threads are its own. Shared state is guarded by one lock.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from pagedllm import _core
from pagedllm.engine.model_fingerprint import DIGEST_CACHE_NAME, model_fingerprint

logger = logging.getLogger("pagedllm")

LAYOUT = "pagedllm-block-major-v1:[layers,2,kv_heads,block_size,head_dim]"


def prompt_keys(tokens: Sequence[int], block_size: int, extra_key: int) -> List[bytes]:
    """The chained persistent keys of the full blocks of `tokens` (block i: tokens[i*bs:(i+1)*bs])."""
    keys: List[bytes] = []
    parent = _core.ROOT_BLOCK_KEY
    arr = np.asarray(tokens, dtype=np.int32)
    for i in range(len(tokens) // block_size):
        parent = _core.block_key(parent, arr[i * block_size:(i + 1) * block_size], extra_key)
        keys.append(parent)
    return keys


class _Prefetch:
    """One request's staged blocks: keys in order, host buffers as they verify; `ancestors`:
    the keys of the prompt's blocks before them (touched with them, tail first)."""

    def __init__(self, keys: List[bytes], tokens: List[np.ndarray],
                 ancestors: Sequence[bytes] = ()):
        self.keys = keys
        self.tokens = tokens
        self.ancestors = list(ancestors)
        self.key_set = frozenset(keys)
        self.buffers: List[np.ndarray] = []
        self.done = False
        self.started = time.monotonic()


class _Io:
    """What the reader and writer threads use: the store, the record header, the queues, the
    lock and the counters. The threads hold this, never the tier, so an engine dropped without
    close() is collected and its finalizer closes the store (releasing the directory's lock)."""

    def __init__(self, store, fingerprint: str, block_size: int, bytes_per_block: int,
                 max_queued_writes: int):
        self.store = store
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.lock = threading.Lock()
        self.landed = threading.Condition(self.lock)  # notified when a prefetch finishes
        self.writes: "queue.Queue" = queue.Queue(maxsize=max_queued_writes)
        self.reads: "queue.Queue" = queue.Queue()
        self.failed_once = False
        self.failed_writes = 0
        self.load_seconds = 0.0
        self.loaded_blocks = 0
        self.closed = False

    def warn_once(self, message: str) -> None:
        if not self.failed_once:
            self.failed_once = True
            logger.warning(message)

    def flush(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.writes.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)


def _read_loop(io: _Io) -> None:
    while True:
        p = io.reads.get()
        if p is None:
            return
        t0 = time.perf_counter()
        for key, toks in zip(p.keys, p.tokens):
            buf = np.empty(io.bytes_per_block, dtype=np.uint8)
            try:
                ok = io.store.get_into(key, io.fingerprint, io.block_size, toks, buf)
            except Exception as e:  # noqa: BLE001 - a broken store is a miss
                io.warn_once(f"reading the persistent KV store failed: {e}")
                ok = False
            if not ok:
                break
            p.buffers.append(buf)
        if p.buffers:  # tail first: the chain's root ends most recent, evicted last
            _touch_chain(io, p.ancestors + p.keys[:len(p.buffers)])
        with io.lock:
            io.load_seconds += time.perf_counter() - t0
            io.loaded_blocks += len(p.buffers)
            p.done = True
            io.landed.notify_all()


def _write_loop(io: _Io) -> None:
    try:  # below the engine's threads: writes wait for idle CPU, steps never wait for them
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
    while True:
        item = io.writes.get()
        if item is None:
            io.writes.task_done()
            return
        key, tokens, data, parent, chain = item
        if key is None:  # a touch queued behind the writes (touch_later)
            _touch_chain(io, chain)
            io.writes.task_done()
            continue
        if parent is not None and not io.store.contains(parent):
            io.writes.task_done()  # its parent is gone: no lookup would ever reach it
            continue
        try:  # evicted before its parent: a capped store keeps chains from the root
            ok = io.store.put(key, io.fingerprint, io.block_size, tokens, data, parent)
        except Exception as e:  # noqa: BLE001
            ok = False
            io.warn_once(f"writing the persistent KV store failed: {e}")
        if ok and chain:
            _touch_chain(io, chain)
        if not ok:
            io.failed_writes += 1
            io.warn_once("a write to the persistent KV store failed (disk full, read-only or "
                         "removed, or a record larger than persistence.max_bytes?); serving "
                         "from memory")
        io.writes.task_done()


def _touch_chain(io: _Io, chain: Sequence[bytes]) -> None:
    """Marks a prompt's blocks (root first in `chain`) used, tail first, so that under
    max_bytes the store evicts a chain from its tail: lookups walk from the root and stop at
    the first missing block, so a surviving child of an evicted parent is never read (plain LRU
    evicted parents first, written and read before their children)."""
    try:
        io.store.touch(list(reversed(chain)))
    except Exception as e:  # noqa: BLE001 - recency is an optimisation
        io.warn_once(f"updating the persistent KV store's recency failed: {e}")


def _close_io(io: _Io, writer: threading.Thread, reader: threading.Thread) -> None:
    """Writes what is queued, stops the threads and closes the store (once)."""
    if io.closed:
        return
    io.closed = True
    io.flush()
    io.writes.put(None)
    io.reads.put(None)
    writer.join(5)
    reader.join(5)
    io.store.close()


class PersistentTier:
    """The engine's view of the persistent block store.

    Args:
        store: an open `_core.BlockStore`.
        fingerprint: model_fingerprint(...) of this engine.
        block_size: tokens per block.
        bytes_per_block: the payload of one block (every layer's keys and values).
        hot_blocks_threshold: 0 = write every full prompt block when computed; N = write a
            block once the prefix cache has served it N times.
        max_queued_writes: writes waiting past this are dropped (counted).
        max_staged_blocks: host buffers held for prefetched blocks at most.
        max_counted_blocks: blocks whose servings are counted toward hot_blocks_threshold at
            most; past it the least recently served is forgotten (its count starts again).
    """

    def __init__(self, store, fingerprint: str, block_size: int, bytes_per_block: int,
                 hot_blocks_threshold: int = 0, max_queued_writes: int = 256,
                 max_staged_blocks: int = 1024, max_counted_blocks: int = 1 << 16):
        self.store = store
        self.fingerprint = fingerprint
        # Folded into every key, so that engines of different models (or dtypes, layouts) can
        # share a directory without reading, or erasing, each other's records.
        self._key_salt = int(fingerprint[:15], 16)
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.hot_blocks_threshold = hot_blocks_threshold
        self.max_staged_blocks = max_staged_blocks
        self._io = _Io(store, fingerprint, block_size, bytes_per_block, max_queued_writes)
        self._lock = self._io.lock
        self._landed = self._io.landed
        self._prefetches: Dict[str, _Prefetch] = {}
        self._staged = 0
        # key -> (tokens, parent key, chain to touch) of a planned store
        self._meta: Dict[bytes, Tuple[np.ndarray, Optional[bytes], Optional[List[bytes]]]] = {}
        # key -> staged bytes of the planned loads of that key, one buffer per load: without
        # prefix caching two requests may load the same block into blocks of their own.
        self._loads: Dict[bytes, List[np.ndarray]] = {}
        # key -> times served from memory, for hot_blocks_threshold, least recently served
        # first; at most max_counted_blocks keys (a block served fewer than N times, then
        # never again, was kept forever: +1 entry per distinct prompt block of a chat server)
        self._served: "collections.OrderedDict[bytes, int]" = collections.OrderedDict()
        self.max_counted_blocks = max_counted_blocks
        self.disk_hit_tokens = 0
        self.disk_lookup_tokens = 0
        self.dropped_writes = 0
        writer = threading.Thread(target=_write_loop, args=(self._io,), name="pagedllm-kv-writer",
                                  daemon=True)
        reader = threading.Thread(target=_read_loop, args=(self._io,), name="pagedllm-kv-reader",
                                  daemon=True)
        writer.start()
        reader.start()
        # Runs at close(), when the tier is collected, or at exit (queued writes reach the
        # disk first); it holds the IO state and threads, not the tier.
        self._finalizer = weakref.finalize(self, _close_io, self._io, writer, reader)

    # --- the scheduler's side -----------------------------------------------------------------
    def keys_for(self, tokens: Sequence[int], extra_key: int) -> List[bytes]:
        """The persistent keys of the full blocks of a prompt under a prefix-cache namespace."""
        mixed = (extra_key * 0x9E3779B97F4A7C15 ^ self._key_salt) & 0xFFFF_FFFF_FFFF_FFFF
        return prompt_keys(tokens, self.block_size, mixed)

    def lookup(self, keys: Sequence[bytes], first: int, limit: int) -> int:
        """How many of keys[first:limit] are on disk, in a row from `first` (index lookups)."""
        n = 0
        for k in keys[first:limit]:
            if not self.store.contains(k):
                break
            n += 1
        return n

    def prefetch(self, request_id: str, keys: List[bytes], tokens: List[np.ndarray],
                 ancestors: Sequence[bytes] = ()) -> bool:
        """Starts reading blocks into host buffers for a request (False: no room staged);
        `ancestors`: the keys of the prompt's blocks before `keys` (their recency is renewed
        with the loaded ones)."""
        with self._lock:
            if request_id in self._prefetches:
                return True
            if self._staged + len(keys) > self.max_staged_blocks:
                return False
            self._staged += len(keys)
            p = _Prefetch(list(keys), list(tokens), ancestors)
            self._prefetches[request_id] = p
        self._io.reads.put(p)
        return True

    def staged(self, request_id: str) -> Optional[List[bytes]]:
        """The keys of a finished prefetch whose blocks verified, in order (possibly none);
        None while it runs or when none was asked for."""
        with self._lock:
            p = self._prefetches.get(request_id)
            if p is None or not p.done:
                return None
            return p.keys[:len(p.buffers)]

    def wait_for_prefetch(self, timeout: float = 0.05) -> None:
        """Blocks (without spinning) until some running prefetch finishes, or `timeout`."""
        with self._lock:
            if any(not p.done for p in self._prefetches.values()):
                self._landed.wait(timeout)

    def being_read(self, key: bytes, request_id: str) -> bool:
        """True while another request's prefetch is reading `key` (its blocks will be in
        memory once that request is admitted: reading them twice is wasted)."""
        with self._lock:
            return any(rid != request_id and not p.done and key in p.key_set
                       for rid, p in self._prefetches.items())

    def pending(self, request_id: str) -> bool:
        """True while a prefetch for the request is running."""
        with self._lock:
            p = self._prefetches.get(request_id)
            return p is not None and not p.done

    def plan_loads(self, request_id: str, keys: List[bytes]) -> None:
        """Moves a finished prefetch's buffers for `keys` to the loads the worker will run."""
        with self._lock:
            p = self._prefetches.pop(request_id, None)
            if p is None:
                return
            self._staged -= len(p.keys)
            by_key = dict(zip(p.keys, p.buffers))
            for k in keys:
                self._loads.setdefault(k, []).append(by_key[k])
        self.disk_hit_tokens += len(keys) * self.block_size

    def release(self, request_id: str) -> None:
        """Forgets a request's prefetch (aborted, or admitted without it)."""
        with self._lock:
            p = self._prefetches.pop(request_id, None)
            if p is not None:
                self._staged -= len(p.keys)

    def note_served(self, key: bytes) -> bool:
        """Counts one more request served `key` from memory; True when it turns hot (to be
        written now, with hot_blocks_threshold N >= 1)."""
        if self.hot_blocks_threshold <= 0:
            return False
        count = self._served.pop(key, 0) + 1
        if count < self.hot_blocks_threshold:
            self._served[key] = count  # now the most recently served
            if len(self._served) > self.max_counted_blocks:
                self._served.popitem(last=False)
            return False
        return not self.store.contains(key)  # hot: counted no more

    def plan_store(self, key: bytes, tokens: np.ndarray, parent: Optional[bytes] = None,
                   chain: Optional[Sequence[bytes]] = None) -> bool:
        """Registers a block to write after the forward; False when it is on disk already.

        Args:
            key: the block's key.
            tokens: its token ids.
            parent: the previous block's key (None for a prompt's first block): the record is
                evicted before it, so a capped store loses chains from the tail.
            chain: the prompt's keys from the root to this block, given with the last block a
                step writes for a request: once written they are touched tail first.
        """
        if self.store.contains(key):
            if chain:
                self.touch_later(chain)
            return False
        with self._lock:
            self._meta[key] = (np.asarray(tokens, dtype=np.int32), parent,
                               list(chain) if chain else None)
        return True

    def touch_later(self, chain: Sequence[bytes]) -> None:
        """Queues a tail-first touch of a chain of keys behind the pending writes."""
        try:
            self._io.writes.put_nowait((None, None, None, None, list(chain)))
        except queue.Full:
            pass

    # --- the worker's side (the transfer plan's source and sink) -----------------------------
    def load_into(self, key: bytes, block: torch.Tensor) -> None:
        """Copies a staged block into a device block view (a transfer plan load).

        Raises:
            RuntimeError: no load of `key` was planned (plan_loads), or all ran already.
        """
        with self._lock:
            bufs = self._loads.get(key)
            if not bufs:
                raise RuntimeError(f"persistent KV tier: no staged load for block key "
                                   f"{key.hex()} (planned loads and the step's plan disagree)")
            buf = bufs.pop()
            if not bufs:
                del self._loads[key]
        src = torch.from_numpy(buf)
        dst = block.view(-1).view(torch.uint8) if block.dtype != torch.uint8 else block.view(-1)
        dst.copy_(src, non_blocking=False)

    def discard(self, loads: Sequence[bytes], stores: Sequence[bytes]) -> None:
        """Forgets the staged buffers of planned loads and the tokens of planned stores that a
        failed step never ran (one buffer per load key, as plan_loads staged them)."""
        with self._lock:
            for key in loads:
                bufs = self._loads.get(key)
                if bufs:
                    bufs.pop()
                    if not bufs:
                        del self._loads[key]
            for key in stores:
                self._meta.pop(key, None)

    def store_block(self, block: torch.Tensor, key: bytes) -> None:
        """Queues a copy of a freshly computed block for writing (a transfer plan store)."""
        with self._lock:
            meta = self._meta.pop(key, None)
        if meta is None:
            return
        tokens, parent, chain = meta
        data = block.reshape(-1).view(torch.uint8).cpu().numpy().copy()
        try:
            self._io.writes.put_nowait((key, tokens, data, parent, chain))
        except queue.Full:
            self.dropped_writes += 1

    # --- lifecycle and figures ----------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> None:
        """Waits until queued writes are on disk (tests, shutdown)."""
        self._io.flush(timeout)

    def close(self) -> None:
        """Writes what is queued, stops the threads and closes the store (releasing the
        directory's lock); later calls do nothing."""
        self._finalizer()

    def stats(self) -> dict:
        """Disk-tier figures for kv_cache_stats()."""
        s = {f"disk_{k}": v for k, v in self.store.stats().items()}
        io = self._io
        s.update(disk_hit_tokens=self.disk_hit_tokens,
                 disk_lookup_tokens=self.disk_lookup_tokens,
                 disk_write_queue=io.writes.qsize(),
                 disk_dropped_writes=self.dropped_writes,
                 disk_failed_writes=io.failed_writes,
                 disk_load_ms_per_block=(1e3 * io.load_seconds / io.loaded_blocks
                                         if io.loaded_blocks else 0.0))
        return s


def open_tier(cfg, model_path: str, fingerprint_parts: Sequence[str], block_size: int,
              bytes_per_block: int) -> PersistentTier:
    """Opens the store a PersistenceConfig names and wraps it.

    Raises:
        ValueError: the store cannot be opened (path, permissions, lock held, backend missing);
            the message names storage_path and the cause.
    """
    # One record: the block's payload, its token ids and a header of 128 bytes with the
    # 64-character fingerprint (block_store.cpp, encode_header).
    record_bytes = bytes_per_block + 4 * block_size + 128
    if cfg.max_bytes and cfg.max_bytes < record_bytes:
        raise ValueError(f"persistence.max_bytes={cfg.max_bytes} holds no record: one block's "
                         f"record is {record_bytes} bytes with this model, KV dtype and "
                         f"block_size; raise max_bytes to at least {record_bytes} (0: no cap)")
    try:
        store = _core.BlockStore(cfg.storage_path, cfg.backend, cfg.max_bytes)
    except Exception as e:  # noqa: BLE001 - pagedllm.Error kinds map to several types
        hint = ""
        if "already open" in str(e):
            hint = (" (in this process, an LLM or engine still referenced holds it: call its "
                    "close() first; one dropped without close() lets go when it is collected)")
        raise ValueError(f"persistence.storage_path {cfg.storage_path!r}: cannot open the "
                         f"{cfg.backend} block store: {e}{hint}") from None
    try:
        fp = model_fingerprint(model_path, [LAYOUT, *fingerprint_parts],
                               os.path.join(cfg.storage_path, DIGEST_CACHE_NAME))
    except BaseException:
        store.close()  # releases the directory's lock
        raise
    return PersistentTier(store, fp, block_size, bytes_per_block, cfg.hot_blocks_threshold)


