"""The scheduler's side of Mllama's cross-attention K/V: their own paged pool and block tables.

Each running sequence of a request with images holds, in a second KVCacheManager (the cross
pool: blocks of the cross-attention layers only, same block size and the same seq ids as the
self pool), the K/V of every valid tile of its images, written once when the sequence is
admitted: all of the request's images must then be encoded (cached in the worker, or encoded
within this step's encoder budget: `max_num_encoder_tokens` counts vision tokens). n > 1 and
beam forks share the parent's cross blocks (a fork is a refcount, never a copy: they are
never written again); the blocks are freed with the sequence (finish, abort, error,
preemption: requests with cross K/V are preempted by recompute and rewritten on readmission,
from the encoder cache when it still holds the images).

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
from pagedllm.multimodal.mllama_ranges import ranges_at


@dataclass
class StepCross:
    """The cross-attention work of one step, for the worker (plain data).

    Attributes:
        free: image hashes whose encoder outputs the worker may drop (before encoding).
        encode: (hash, MllamaImageInput) of the images to encode this step.
        writes: (image hashes of one sequence, in order; int64 cross slots of their valid
            tiles' vision tokens, in the same order) to write before the forward.
        block_tables: int32 [num_seqs, W], every scheduled entry's cross blocks (zeros
            without images).
        context_lens: int32 [num_seqs], cross tokens per entry (0 without images).
        kv_ranges: int32 [num_tokens, 2], the cross tokens [lo, hi) each packed token sees.
    """

    free: List[bytes]
    encode: List[Tuple[bytes, object]]
    writes: List[Tuple[Tuple[bytes, ...], np.ndarray]]
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
    """

    def __init__(self, num_blocks: int, block_size: int, encoder: EncoderScheduler):
        self.kv = _core.KVCacheManager(num_blocks, block_size, False, 0)
        self.block_size = block_size
        self.encoder = encoder
        self._pending: Dict[int, Tuple[Tuple[bytes, ...], np.ndarray, list]] = {}

    # --- request lifetime ---------------------------------------------------------------------
    def add_request(self, req) -> None:
        """A request with cross images joined the engine."""
        self.encoder.add_request(req.cross_images)

    def release_request(self, req) -> None:
        """A request with cross images finished (its encoder outputs may be dropped)."""
        self.encoder.release_request(req.cross_images)

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
        """The ask: can a sequence of `req` be admitted now (cross blocks free, every image
        cached or encodable within this step's budget)? No side effects."""
        if self.blocks_needed(req.cross_images) > self.kv.num_available_blocks:
            return False
        return self.encoder.fit(_wholes(req.cross_images), 0, 1) == 1

    def admit(self, seq) -> None:
        """The do: allocates `seq`'s cross blocks and plans their write in this step."""
        images = seq.request.cross_images
        n = sum(im.num_cross_tokens for im in images)
        res = self.kv.admit(seq.seq_id, np.zeros(n, dtype=np.int32),
                            np.zeros(0, dtype=np.uint64), 0, 0, n)
        assert res is not None, "fits() promised room"
        wholes = _wholes(images)
        self.encoder.reserve(wholes, 0, 1)
        self._pending[seq.seq_id] = (tuple(im.content_hash for im in images), res[1], wholes)

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
        for hashes, slots, wholes in self._pending.values():
            writes.append((hashes, slots))
            spans.append((wholes, 0, 1, 0))
        self._pending = {}
        mm = self.encoder.step_inputs(spans)  # encodes the uncached; frees the released
        free, encode = (mm.free, [(h, im) for h, im in mm.encode]) if mm else ([], [])
        return StepCross(free, encode, writes, tables, ctx, ranges)
