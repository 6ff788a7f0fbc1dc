"""The scheduler's side of Mllama's cross-attention K/V: their own paged pool and block tables.

Each running sequence of a request with images holds, in a second KVCacheManager (the cross
pool: blocks of the cross-attention layers only, same block size and the same seq ids as the
self pool), the K/V of every valid tile of its images, written when the sequence is admitted:
the images whose tokens are not already in the pool must then be encoded (cached in the
worker, or encoded within this step's encoder budget: `max_num_encoder_tokens` counts vision
tokens). n > 1 and beam forks share the parent's cross blocks (a fork is a refcount, never a
copy: they are never written again); the blocks are freed with the sequence (finish, abort,
error, preemption: requests with cross K/V are preempted by recompute and readmitted).

With prefix caching on, the cross pool is content-keyed like the self pool: a sequence's
cross "tokens" are ids drawn from each image's content hash and the token's place in it
(hashing.placeholder_cache_ids), image after image, so the full blocks of a run of images
already in the pool (another request's with the same images in the same order, or this
request's own before a preemption) are shared, not written again; only the rest is written.

The encoder outputs are tracked by an EncoderScheduler (refcounts per image hash, the unused
LRU, the per-step budget); to it every Mllama image is a whole: each is handed over as if it
spanned position 0 of a one-position prompt (`_Whole`), so a request's admission asks for all
its images at once.

This object is one of the scheduler's helpers: it reads Requests and Sequences and writes only
its own state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from pagedllm import _core
from pagedllm.multimodal.encoder_schedule import EncoderScheduler
from pagedllm.multimodal.hashing import placeholder_cache_ids
from pagedllm.multimodal.mllama_ranges import ranges_at


@dataclass
class StepCross:
    """The cross-attention work of one step, for the worker (plain data).

    Attributes:
        free: image hashes whose encoder outputs the worker may drop (before encoding).
        encode: (hash, MllamaImageInput) of the images to encode this step.
        writes: (image hashes of one sequence, in order; how many leading vision tokens of
            them are in the pool already; int64 cross slots of the rest of their valid tiles'
            vision tokens, in order) to write before the forward.
        block_tables: int32 [num_seqs, W], every scheduled entry's cross blocks (zeros
            without images).
        context_lens: int32 [num_seqs], cross tokens per entry (0 without images).
        kv_ranges: int32 [num_tokens, 2], the cross tokens [lo, hi) each packed token sees.
    """

    free: List[bytes]
    encode: List[Tuple[bytes, object]]
    writes: List[Tuple[Tuple[bytes, ...], int, np.ndarray]]
    block_tables: np.ndarray
    context_lens: np.ndarray
    kv_ranges: np.ndarray


@dataclass(frozen=True)
class _Whole:
    """An Mllama image as the EncoderScheduler sees it: needed whole, at position 0."""

    content_hash: bytes
    length: int  # vision tokens of its valid tiles (the encoder budget it takes)
    pixel_values: object = field(compare=False)  # the MllamaImageInput (what the worker encodes)
    offset: int = 0

    @property
    def end(self) -> int:
        return 1


def _wholes(images: Sequence) -> List[_Whole]:
    return [_Whole(im.content_hash, im.num_cross_tokens, im) for im in images]


class CrossScheduler:
    """The cross pool's block tables and the encoder bookkeeping of Mllama requests.

    Args:
        num_blocks: blocks in the cross pool (the worker's layout).
        block_size: tokens per block (the self pool's).
        encoder: the encoder outputs' bookkeeping and budget (vision tokens per step).
        share: key the cross blocks by content and share them across requests (the engine's
            enable_prefix_caching).
    """

    def __init__(self, num_blocks: int, block_size: int, encoder: EncoderScheduler,
                 share: bool = True):
        self.kv = _core.KVCacheManager(num_blocks, block_size, share, 0)
        self.block_size = block_size
        self.encoder = encoder
        # seq id -> (image hashes, skip, slots, encoder views) of the write planned this step
        self._pending: Dict[int, Tuple[Tuple[bytes, ...], int, np.ndarray, list]] = {}
        self._keys: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}  # request id -> ids, hashes

    # --- request lifetime ---------------------------------------------------------------------
    def add_request(self, req) -> None:
        """A request with cross images joined the engine."""
        self.encoder.add_request(req.cross_images)

    def release_request(self, req) -> None:
        """A request with cross images finished (its encoder outputs may be dropped)."""
        self.encoder.release_request(req.cross_images)
        self._keys.pop(req.request_id, None)

    def _request_keys(self, req) -> Tuple[np.ndarray, np.ndarray]:
        """(int32 cross ids [vision tokens], uint64 full-block hashes) of a request, made once."""
        got = self._keys.get(req.request_id)
        if got is None:
            ids = np.concatenate([placeholder_cache_ids(im.content_hash, im.num_cross_tokens)
                                  for im in req.cross_images])
            got = self._keys[req.request_id] = (ids, self.kv.block_hashes(ids, 0))
        return got

    def _to_write(self, req, cached: int) -> Tuple[list, int]:
        """The images whose tokens lie past the first `cached` (the write's), and how many of
        their leading tokens are cached already."""
        start, out, skip = 0, [], 0
        for im in req.cross_images:
            end = start + im.num_cross_tokens
            if end > cached:
                if not out:
                    skip = max(0, cached - start)
                out.append(im)
            start = end
        return out, skip

    def check_request(self, images: Sequence) -> None:
        """Raises ValueError when a sequence with these images could never be admitted: more
        cross blocks than the pool has, or more vision tokens than one step may encode."""
        tokens = sum(im.num_cross_tokens for im in images)
        need = self.blocks_needed(images)
        if need > self.kv.num_blocks:
            raise ValueError(
                f"the prompt's {len(images)} image(s) give {tokens} vision tokens = {need} "
                f"cross-attention KV blocks of {self.block_size} tokens, but the cross pool has "
                f"{self.kv.num_blocks}: raise num_cross_kv_blocks or cross_kv_fraction (or "
                f"kv_cache_memory_bytes), or send fewer or smaller images")
        if tokens > self.encoder.max_num_encoder_tokens:
            raise ValueError(
                f"the prompt's {len(images)} image(s) give {tokens} vision tokens, encoded "
                f"together when the request is admitted, but max_num_encoder_tokens = "
                f"{self.encoder.max_num_encoder_tokens}: raise it or send fewer images")

    def blocks_needed(self, images: Sequence) -> int:
        """Cross blocks one sequence with these images holds."""
        return -(-sum(im.num_cross_tokens for im in images) // self.block_size)

    # --- admission ----------------------------------------------------------------------------
    def fits(self, req) -> bool:
        """The ask: can a sequence of `req` be admitted now (its cross blocks not in the pool
        free, every image it writes cached or encodable within this step's budget)? No side
        effects."""
        ids, hashes = self._request_keys(req)
        n = len(ids)
        cached, fit = self.kv.query_admission(ids, hashes, 0, n, n)
        if fit < n - cached:
            return False
        images, _ = self._to_write(req, cached)
        return self.encoder.fit(_wholes(images), 0, 1) == 1

    def admit(self, seq) -> None:
        """The do: gives `seq` its cross blocks (the pool's where they hold its images, new
        ones for the rest) and plans the write of the new ones in this step."""
        req = seq.request
        ids, hashes = self._request_keys(req)
        n = len(ids)
        cached, _ = self.kv.query_admission(ids, hashes, 0, n, n)
        res = self.kv.admit(seq.seq_id, ids, hashes, 0, n, n - cached)
        assert res is not None and res[0] == cached, "fits() promised room"
        images, skip = self._to_write(req, cached)
        if not images:
            return  # every block is shared: nothing to write
        wholes = _wholes(images)
        self.encoder.reserve(wholes, 0, 1)
        self._pending[seq.seq_id] = (tuple(im.content_hash for im in images), skip, res[1],
                                     wholes)

    def fork(self, parent_id: int, child_id: int) -> None:
        """`child` shares its parent's cross blocks (no-op when the parent holds none)."""
        if self.kv.contains(parent_id):
            self.kv.fork(parent_id, child_id)

    def free(self, seq_id: int) -> None:
        """Frees a sequence's cross blocks (no-op when it holds none)."""
        self._pending.pop(seq_id, None)
        if self.kv.contains(seq_id):
            self.kv.free(seq_id)

    # --- one step -----------------------------------------------------------------------------
    def step_inputs(self, entries: Sequence, cu_seqlens_q: np.ndarray) -> Optional[StepCross]:
        """The worker's cross work for the packed entries (ScheduledSeqs); None when no entry
        holds cross K/V (the cross-attention layers are then skipped)."""
        holders = [i for i, e in enumerate(entries) if self.kv.contains(e.seq.seq_id)]
        if not holders and not self._pending:
            return None
        n = len(entries)
        ids = np.fromiter((e.seq.seq_id for e in entries), dtype=np.int64, count=n)
        tables = np.zeros((n, 1), dtype=np.int32)
        ctx = np.zeros(n, dtype=np.int32)
        ranges = np.zeros((int(cu_seqlens_q[-1]), 2), dtype=np.int32)
        if holders:
            held = self.kv.block_tables(ids[holders])
            tables = np.zeros((n, held.shape[1]), dtype=np.int32)
            tables[holders] = held
            for i in holders:
                e = entries[i]
                ctx[i] = self.kv.num_tokens(e.seq.seq_id)
                ranges[cu_seqlens_q[i]:cu_seqlens_q[i + 1]] = ranges_at(
                    e.seq.request.cross_ranges, e.start, e.num_new_tokens)
        writes = []
        spans = []
        for hashes, skip, slots, wholes in self._pending.values():
            writes.append((hashes, skip, slots))
            spans.append((wholes, 0, 1, 0))
        self._pending = {}
        mm = self.encoder.step_inputs(spans)  # encodes the uncached; frees the released
        free, encode = (mm.free, [(h, im) for h, im in mm.encode]) if mm else ([], [])
        return StepCross(free, encode, writes, tables, ctx, ranges)
