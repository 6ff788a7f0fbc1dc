"""Continuous batching over the paged KV cache, and the one owner of request state.

Every step the scheduler picks what to compute under two budgets, ``max_num_batched_tokens``
and ``max_num_seqs``:
1. running sequences first, in arrival order: one token for a decoding sequence, the next chunk
   of the prompt for one still in prefill (chunked prefill, so a long prompt never stalls the
   decodes). Slots come from ``KVCacheManager.append``; when the pool runs out, the
   latest-arrived running sequence is preempted until the append fits: by *recompute* (blocks
   freed, its prefix mostly still cached) or, with ``preemption_mode="swap"``, by *swapping*
   its blocks to the host pool through the step's KV transfer plan;
2. then, if nothing was preempted, swapped sequences are swapped back in (arrival order), and
   once none is left, waiting sequences are admitted (arrival order) as long as their first
   chunk fits and the watermark stays free. Admission is one ask (``query_admission``) and one
   do (``admit``) on the prompt's block hashes, computed once per request;
3. if that schedules nothing although work remains (beams holding blocks while they wait for
   their siblings, or a request that cannot fit), idle sequences are preempted to make room,
   and a request that cannot run even in an empty pool is failed with an error naming the
   numbers, so the engine never stalls.

``schedule()`` returns a SchedulerOutput: numpy arrays only (token ids, positions, slots,
block tables, which rows to sample) plus the KV transfer plan. After the executor ran it and
the sampler drew the tokens, ``update_from_output()`` applies the step: computed counts, prompt
logprobs, sampled tokens, stop rules, beam search, finishing. Nothing else in the engine writes
a Request or a Sequence (tests/python/test_state_ownership.py checks it); the scheduler never
touches a tensor on a device (the step's logits arrive on the host).
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch

from pagedllm import _core
from pagedllm.engine import beam_search
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.engine.sampler import SampleResult, SampleTarget
from pagedllm.engine.sequence import Request, Sequence, SequenceStatus
from pagedllm.engine.stop_checker import StopChecker
from pagedllm.engine.transfer_plan import KVTransferPlan, as_pairs
from pagedllm.multimodal.cross_schedule import CrossScheduler, StepCross
from pagedllm.multimodal.encoder_schedule import EncoderScheduler, StepMultiModal
from pagedllm.outputs import BeamSearchOutput, RequestOutput
from pagedllm.sampling_params import BeamSearchParams
from pagedllm.sparse.config import SparseAttentionConfig
from pagedllm.sparse.plan import SparsePlan
from pagedllm.sparse.scheduling import SparseScheduling

logger = logging.getLogger("pagedllm")

PREEMPTION_MODES = ("recompute", "swap")


def _arrival(s: Sequence) -> tuple:
    return s.arrival_key


@dataclass
class ScheduledSeq:
    """One sequence's share of a step.

    Attributes:
        seq: the sequence.
        start: position of its first new token (== num_computed_tokens before the step).
        num_new_tokens: tokens computed for it in this step.
        forks: sequences forked from it in this step (best_of > 1 at the end of the prompt);
            they share its blocks and sample from its logits row.
    """

    seq: Sequence
    start: int
    num_new_tokens: int
    forks: List[Sequence] = field(default_factory=list)

    @property
    def context_len(self) -> int:
        """Tokens of context once this step has run (cached + new)."""
        return self.start + self.num_new_tokens


@dataclass
class SchedulerOutput:
    """What one step computes: everything the worker needs, as numpy arrays.

    Attributes:
        scheduled: the sequences, the num_decode_seqs single-token ones first.
        num_decode_seqs: how many leading entries have exactly one new token.
        input_ids: int64 [num_tokens], the new tokens, packed in entry order.
        positions: int64 [num_tokens], each new token's position in its sequence.
        slot_mapping: int64 [num_tokens], the cache slot of every new token.
        block_tables: int32 [num_seqs, max_blocks], padded with 0.
        context_lens: int32 [num_seqs], tokens of context after the step.
        cu_seqlens_q: int32 [num_seqs + 1], prefix sums of the new-token counts.
        logits_indices: int64 [num_sampled], the packed rows whose logits are sampled (the
            last new token of each entry whose known tokens are then all computed).
        prompt_logit_spans: (entry index, first row, end row) of the rows whose logits give
            prompt logprobs.
        transfer: the step's block moves (swaps, copy-on-write copies, persistent tier).
        sample_targets: the draws to make: row = index into logits_indices.
        beam_rows: (row, sequence) of beam-search beams, whose candidates are ranked instead.
        preempted: sequences preempted while scheduling this step.
        multimodal: the step's image work (encodes, embedding rows), None without images.
        cross: the step's Mllama cross-attention work (encodes, cross K/V writes, cross block
            tables, per-token ranges), None when no entry has cross K/V.
        sparse: the decode sequences' block-sparse plan (None: every block is read).
    """

    scheduled: List[ScheduledSeq]
    num_decode_seqs: int
    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    context_lens: np.ndarray
    cu_seqlens_q: np.ndarray
    logits_indices: np.ndarray
    prompt_logit_spans: List[Tuple[int, int, int]]
    transfer: KVTransferPlan
    sample_targets: List[SampleTarget] = field(default_factory=list)
    beam_rows: List[Tuple[int, Sequence]] = field(default_factory=list)
    preempted: List[Sequence] = field(default_factory=list)
    multimodal: Optional[StepMultiModal] = None
    sparse: Optional[SparsePlan] = None
    cross: Optional[StepCross] = None

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class _Step:
    """What schedule() collects before it packs the output."""

    entries: List[ScheduledSeq] = field(default_factory=list)
    slots: List[np.ndarray] = field(default_factory=list)
    cow: List[np.ndarray] = field(default_factory=list)
    swap_out: List[Tuple[int, int]] = field(default_factory=list)
    swap_in: List[Tuple[int, int]] = field(default_factory=list)
    loads: List[Tuple[bytes, int]] = field(default_factory=list)
    stores: List[Tuple[int, bytes]] = field(default_factory=list)
    preempted: List[Sequence] = field(default_factory=list)
    # the running sequences' fast path (every one decodes a token): (seq_ids int64, starts
    # int64, tokens int32) of entries[:k], whose k slots are slots[0], one array
    decode: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None

    def add(self, seq: Sequence, start: int, n: int, slots: np.ndarray, cow: np.ndarray) -> None:
        self.entries.append(ScheduledSeq(seq, start, n))
        self.slots.append(slots)
        if len(cow):
            self.cow.append(cow)


class Scheduler:
    """Decides, step by step, which tokens of which sequences to compute, and applies results.

    Args:
        kv: the KV-cache manager (the scheduler's only view of device memory).
        max_num_seqs: most sequences in one step.
        max_num_batched_tokens: most new tokens in one step.
        eos_token_ids: end-of-sequence ids (stop rules, beam search).
        max_model_len: longest sequence.
        tokenizer: for text and stop strings (None: token ids only).
        preemption_mode: "recompute" or "swap" (to `num_host_blocks` host blocks; a victim
            that does not fit there is recomputed).
        num_host_blocks: size of the host swap pool in blocks (0: no swapping).
        tier: the persistent KV tier (engine/kv_tier.py), or None.
        encoder: the encoder cache and budget of a multimodal model, or None.
        cross: the cross-attention K/V pool's block tables of an Mllama model, or None.
    """

    def __init__(self, kv: _core.KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 eos_token_ids: Iterable[int] = (), max_model_len: int = 1 << 30,
                 tokenizer=None, preemption_mode: str = "recompute", num_host_blocks: int = 0,
                 tier=None, encoder: Optional[EncoderScheduler] = None,
                 sparse_attention: Optional[SparseAttentionConfig] = None,
                 cross: Optional[CrossScheduler] = None):
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}, "
                             f"got {preemption_mode!r}")
        self.kv = kv
        self.block_size = kv.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = list(eos_token_ids)
        self.max_model_len = max_model_len
        self.preemption_mode = preemption_mode
        self.host = _core.BlockAllocator(num_host_blocks) if num_host_blocks > 0 else None
        self.tier = tier
        self.encoder = encoder
        self.cross = cross
        self.sparse = SparseScheduling(sparse_attention, self.block_size)
        self.processor = OutputProcessor(StopChecker(self.eos_token_ids, max_model_len, tokenizer),
                                         tokenizer)
        self.requests: Dict[str, Request] = {}
        self.waiting: List[Sequence] = []  # sorted by arrival_key
        self.running: List[Sequence] = []  # sorted by arrival_key
        self.swapped: List[Sequence] = []  # sorted by arrival_key
        self.stream_outputs = True
        self._host_to_release: List[int] = []  # host blocks read by the last step's swap-ins
        self._failed: List[RequestOutput] = []
        self.num_preemptions = 0
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.num_generation_tokens = 0

    # --- requests -----------------------------------------------------------------------------
    def add_request(self, req: Request, beam: Optional[BeamSearchParams] = None) -> None:
        """Queues a new request (validated by the engine); `beam` makes it a beam search."""
        if beam is not None:
            req.beam = beam_search.BeamSearchState(beam)
        self.sparse.check_request(req.params)
        self.requests[req.request_id] = req
        self.sparse.track(req.request_id, req.params)
        if req.images:
            self.encoder.add_request(req.images)
        if req.cross_images:
            self.cross.add_request(req)
        self._enqueue(req.seqs[0])

    def abort_request(self, request_id: str) -> None:
        """Finishes every sequence of a request as "abort" and frees its blocks (no output)."""
        req = self._drop_request(request_id)
        if req is None:
            return
        for seq in req.seqs:
            self._finish(seq, "abort")

    def fail_request(self, req: Request, message: str) -> None:
        """Finishes a request with finish_reason "error"; its output (with `message`) is
        returned by the next update_from_output / take_failed_outputs."""
        if req.request_id not in self.requests or req.error is not None:
            return
        req.error = message
        for seq in req.seqs:
            self._finish(seq, "error")
        if req.beam is not None:
            req.beam.done = True
            return  # kept until pop_finished_beam reports it
        self._drop_request(req.request_id)
        self._failed.append(OutputProcessor.request_output(req))

    def _drop_request(self, request_id: str) -> Optional[Request]:
        """Forgets a request that left the engine; returns it (None: unknown)."""
        self.sparse.forget(request_id)
        return self.requests.pop(request_id, None)

    def take_failed_outputs(self) -> List[RequestOutput]:
        """The outputs of requests failed since the last call."""
        out, self._failed = self._failed, []
        return out

    def pop_beam_result(self, request_id: str, tokenizer=None) -> Optional[BeamSearchOutput]:
        """The beams of a finished beam-search request (forgotten here), or None while it runs.

        Raises:
            RuntimeError: the engine failed the request (the message says why).
        """
        req = self.requests.get(request_id)
        if req is None or req.beam is None or not req.beam.done:
            return None
        self._drop_request(request_id)
        if req.error is not None:
            raise RuntimeError(f"beam search request {request_id}: {req.error}")
        try:
            return beam_search.result(req, set(self.eos_token_ids), tokenizer)
        except Exception as e:  # noqa: BLE001 - ranking or decoding one request's beams: fail it
            logger.exception("beam search request %s: building its result failed", request_id)
            raise RuntimeError(f"beam search request {request_id}: building its result failed: "
                               f"{type(e).__name__}: {e}") from e

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # --- queues -------------------------------------------------------------------------------
    def _enqueue(self, seq: Sequence) -> None:
        """Queues a sequence that holds no blocks (new or preempted), in arrival order."""
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_arrival)

    def _run(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=_arrival)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Makes `child` share every KV block of the running `parent` (copy-on-write later)."""
        assert parent.status is SequenceStatus.RUNNING, parent
        self.kv.fork(parent.seq_id, child.seq_id)
        if self.cross is not None:
            self.cross.fork(parent.seq_id, child.seq_id)
        child.num_computed_tokens = parent.num_computed_tokens
        child.sparse_kv = parent.sparse_kv
        self._run(child)

    def add_beam(self, seq: Sequence) -> None:
        """Queues a new beam whose parent holds no device blocks (it is recomputed)."""
        self._enqueue(seq)

    def _release(self, seq: Sequence) -> None:
        """Drops a sequence from the queues and frees its device or host blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._free_blocks(seq)
        elif seq.status is SequenceStatus.WAITING:
            if seq in self.waiting:
                self.waiting.remove(seq)
        elif seq.status is SequenceStatus.SWAPPED:
            self.swapped.remove(seq)
            self._host_to_release.extend(seq.host_blocks or ())
            seq.host_blocks = None

    def _finish(self, seq: Sequence, reason: str) -> None:
        """Marks seq finished with `reason` and frees its blocks."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if reason not in ("abort", "error"):
            self.processor.stop.finish_text(seq)
        self._release(seq)
        if self.tier is not None and seq.index == 0:
            self.tier.release(seq.request.request_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        req = seq.request
        if req.finished and req.finish_time is None:
            req.finish_time = time.monotonic()
            if req.images:
                self.encoder.release_request(req.images)
            if req.cross_images:
                self.cross.release_request(req)

    def _free_blocks(self, seq: Sequence) -> None:
        """Frees a sequence's device blocks (self pool, and cross pool when it holds some)."""
        self.kv.free(seq.seq_id)
        if self.cross is not None:
            self.cross.free(seq.seq_id)

    # --- scheduling ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Picks this step's work, reserves its slots and plans its block moves."""
        if self._host_to_release:
            for b in self._host_to_release:
                self.host.decref(b)
            self._host_to_release = []
        step = _Step()
        if self.encoder is not None:
            self.encoder.begin_step()
        budget = self._schedule_running(self.max_num_batched_tokens, step)
        if not step.preempted:
            budget = self._schedule_swapped(budget, step)
            if not self._swapped_pending():
                self._schedule_waiting(budget, step)
        if not step.entries and self.has_work:
            self._unblock(step)
        return self._pack(step)

    def _schedule_running(self, budget: int, step: _Step) -> int:
        todo = [s for s in self.running if len(s.token_ids) > s.num_computed_tokens]
        if not todo:
            return budget
        self._stop_caching_sparse(todo)
        # Fast path: every running sequence decodes one token and the pool has room (a last
        # prompt token of an image prompt takes the slow path: cache ids, encoder budget).
        if all(len(s.token_ids) - s.num_computed_tokens == 1 and not (
                s.request.images and s.num_computed_tokens < s.num_prompt_tokens)
               for s in todo) and len(todo) <= budget:
            n = len(todo)
            ids = np.fromiter((s.seq_id for s in todo), dtype=np.int64, count=n)
            toks = np.fromiter((s.token_ids[-1] for s in todo), dtype=np.int32, count=n)
            res = self.kv.append_batch(ids, np.ones(n, dtype=np.int32), toks)
            if res is not None:
                all_slots, pairs = res
                starts = np.fromiter((s.num_computed_tokens for s in todo), dtype=np.int64,
                                     count=n)
                step.entries.extend([ScheduledSeq(s, s.num_computed_tokens, 1) for s in todo])
                step.slots.append(all_slots)  # the n entries' slots, one array (_Step.decode)
                step.decode = (ids, starts, toks)
                if len(pairs):
                    step.cow.append(pairs)
                return budget - n
        # Slow path: one sequence at a time, preempting the latest arrivals when out of blocks.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if seq.request.images:  # stop before an image the step cannot encode
                n = self.encoder.fit(seq.request.images, seq.num_computed_tokens, n)
            if n == 0:
                i += 1
                continue
            start = seq.num_computed_tokens
            res = None
            while res is None:
                res = self.kv.append(seq.seq_id, seq.kv_tokens(start, start + n))
                if res is None:
                    if self.running == [seq]:  # alone and still out of blocks: it never fits
                        self.fail_request(seq.request, self._cannot_fit(seq))
                        break
                    victim = self.running[-1]
                    self._preempt(victim, step)
                    if victim is seq:
                        break
            if res is None:
                break  # the current sequence was itself the latest arrival, or failed
            step.add(seq, start, n, res[0], res[1])
            if seq.request.images:
                self.encoder.reserve(seq.request.images, start, n)
            budget -= n
            i += 1
        return budget

    def _preempt(self, seq: Sequence, step: _Step) -> None:
        """Takes a running sequence's blocks away: swapped to the host pool when the mode and
        the host pool allow, else freed to be recomputed (streaming sequences with dropped
        blocks and cross-attention ones always are). The victim has no entry in this step (it
        is the latest arrival, or idle)."""
        self.num_preemptions += 1
        seq.num_preemptions += 1
        step.preempted.append(seq)
        self.running.remove(seq)
        if (self.preemption_mode == "swap" and self.host is not None
                and not seq.request.cross_images  # cross K/V: recomputed, never swapped
                and not self.sparse.dropped_any(self.kv, seq.seq_id)):
            table = self.kv.block_table(seq.seq_id)
            host_ids = self.host.allocate_n(len(table)) if len(table) else []
            if host_ids is not None:
                step.swap_out.extend(zip(table.tolist(), list(host_ids)))
                self.kv.free(seq.seq_id)
                seq.host_blocks = list(host_ids)
                seq.status = SequenceStatus.SWAPPED
                bisect.insort(self.swapped, seq, key=_arrival)
                self.num_swap_outs += 1
                return
        self._free_blocks(seq)
        seq.num_computed_tokens = 0
        seq.sparse_kv = False  # recomputed: its prompt and tokens are prefilled densely
        self._enqueue(seq)

    def _swapped_pending(self) -> bool:
        """True while a swapped sequence waits to come back (new admissions wait for it)."""
        return any(not s.is_idle for s in self.swapped)

    def _hashes(self, req: Request) -> np.ndarray:
        """The prompt's block hashes, computed once per request (kept across preemptions)."""
        if req.block_hashes is None:
            req.block_hashes = self.kv.block_hashes(self._prompt_kv(req), req.extra_key)
        return req.block_hashes

    @staticmethod
    def _prompt_kv(req: Request) -> np.ndarray:
        """The prompt as the KV manager and the persistent tier key it (image positions hold
        their content-derived ids)."""
        if req.kv_prompt_ids is not None:
            return req.kv_prompt_ids
        return np.asarray(req.prompt_token_ids, dtype=np.int32)

    def _schedule_swapped(self, budget: int, step: _Step) -> int:
        bs = self.block_size
        for seq in list(self.swapped):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if seq.is_idle:
                continue
            req = seq.request
            computed = seq.num_computed_tokens
            n_new = min(seq.num_tokens - computed, budget)
            if req.images:  # stop before an image the step cannot encode
                n_new = self.encoder.fit(req.images, computed, n_new)
                if n_new == 0:
                    break
            tokens = seq.kv_tokens()
            hashes = self._hashes(req)
            cached, fit = self.kv.query_admission(tokens, hashes, req.extra_key, computed,
                                                  seq.num_tokens)
            need = computed - cached + n_new
            if fit < need:
                break
            # Sparse-decoded K/V come back from the host, or this step decodes sparsely: keep
            # them out of the prefix cache.
            if (not seq.sparse_kv and n_new == 1 and computed >= seq.num_prompt_tokens
                    and self.kv.enable_prefix_caching
                    and self.sparse.reads_fewer(req.params, seq.num_tokens)):
                seq.sparse_kv = True
            res = self.kv.admit(seq.seq_id, tokens, hashes, req.extra_key, computed, need,
                                cache_new_blocks=not seq.sparse_kv)
            assert res is not None and res[0] == cached, "query_admission promised room"
            _, slots, cow = res
            table = self.kv.block_table(seq.seq_id)
            # Blocks past the cached prefix come back from the host (the cached ones are on
            # the device already); the last may be partial and this step writes into it.
            for i in range(cached // bs, -(-computed // bs)):
                step.swap_in.append((seq.host_blocks[i], int(table[i])))
            self._host_to_release.extend(seq.host_blocks)
            seq.host_blocks = None
            self.swapped.remove(seq)
            self._run(seq)
            self.num_swap_ins += 1
            step.add(seq, computed, n_new, slots[computed - cached:], cow)
            if req.images:
                self.encoder.reserve(req.images, computed, n_new)
            budget -= n_new
        return budget

    def _next_waiting(self, start: int, skip: set = frozenset()) -> int:
        """Index of the next sequence to admit at or after `start`: arrival order, except that
        among grouped requests the group with the fewest running sequences goes first."""
        if not any(s.request.group is not None for s in self.waiting[start:start + 1]):
            return start
        running: Dict[str, int] = {}
        for s in self.running:
            if s.request.group is not None:
                running[s.request.group] = running.get(s.request.group, 0) + 1
        best, best_key = start, None
        seen = set()
        for i in range(start, len(self.waiting)):
            g = self.waiting[i].request.group
            if g is None or g in seen or self.waiting[i].is_idle or self.waiting[i].seq_id in skip:
                continue
            seen.add(g)  # the earliest waiting sequence of each group
            key = running.get(g, 0)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best

    def _schedule_waiting(self, budget: int, step: _Step) -> None:
        bs = self.block_size
        skip: set = set()  # sequences waiting for their disk blocks to be read
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            if self.waiting[i].is_idle or self.waiting[i].seq_id in skip:
                i += 1
                continue
            i = self._next_waiting(i, skip)
            seq = self.waiting[i]
            req = seq.request
            tokens = seq.kv_tokens()
            hashes = self._hashes(req)
            # Prompt logprobs need logits at every prompt position: no prefix hits for those.
            max_cached = 0 if req.prompt_logprobs is not None else seq.num_tokens
            disk_room = seq.num_prompt_tokens if self.tier is not None else 0
            cached, fit = self.kv.query_admission(tokens, hashes, req.extra_key, max_cached,
                                                  budget + disk_room)
            keys: List[bytes] = []
            if self.tier is not None and max_cached > 0:
                got = self._disk_keys(seq, cached)
                if got is None:  # its blocks are being read: admit others meanwhile
                    skip.add(seq.seq_id)
                    i = 0
                    continue
                keys = got
            nd = len(keys) * bs
            n = min(seq.num_tokens - cached - nd, budget)
            if req.images:  # stop before an image the step cannot encode
                n = self.encoder.fit(req.images, cached + nd, n)
                if n == 0:
                    skip.add(seq.seq_id)
                    i = 0
                    continue
            if fit < nd + n:
                # With nothing running, admit a smaller first chunk rather than stall forever.
                if self.running or fit < nd + min(n, bs):
                    break
                n = fit - nd
            if req.cross_images and not self.cross.fits(req):
                break  # its cross blocks or its images' encoding must wait (arrival order)
            res = self.kv.admit(seq.seq_id, tokens, hashes, req.extra_key, max_cached, nd + n)
            assert res is not None and res[0] == cached, "query_admission promised room"
            self.waiting.pop(i)
            if keys:
                self.tier.plan_loads(req.request_id, keys)
                table = self.kv.block_table(seq.seq_id)
                step.loads.extend((k, int(table[cached // bs + j])) for j, k in enumerate(keys))
            elif self.tier is not None:
                self.tier.release(req.request_id)
            if self.tier is not None and cached:
                if self.tier.hot_blocks_threshold > 0:
                    self._store_hot(seq, cached, step)
                else:  # served from memory: renew the records' recency on disk too
                    keys_now = self._persistent_keys(req)[:cached // bs]
                    if keys_now:
                        self.tier.touch_later(keys_now)
            seq.num_computed_tokens = cached + nd
            if req.cross_images:
                self.cross.admit(seq)
            step.add(seq, cached + nd, n, res[1][nd:], res[2])
            if req.images:
                self.encoder.reserve(req.images, cached + nd, n)
            budget -= n
            self._run(seq)
            i = 0  # the next pick starts over (idle sequences stay skipped)

    def _stop_caching_sparse(self, todo: List[Sequence]) -> None:
        """Sequences about to decode with block-sparse attention that reads fewer blocks than
        they hold: the blocks they fill from now on stay out of the prefix cache (before the
        append that may fill one), so a later dense request, or one with other sparse settings,
        never reuses K/V that sparse attention computed."""
        if not self.sparse.maybe_sparse or not self.sparse.any_sparse(
                [s.request.params for s in todo]):
            return
        for s in todo:
            if (s.num_tokens - s.num_computed_tokens == 1
                    and s.num_computed_tokens >= s.num_prompt_tokens
                    and self.kv.caching(s.seq_id)
                    and self.sparse.reads_fewer(s.request.params, s.num_tokens)):
                self.kv.stop_caching(s.seq_id)
                s.sparse_kv = True

    # --- the persistent tier ------------------------------------------------------------------
    def _persistent_keys(self, req: Request) -> list:
        if req.persistent_keys is None:
            req.persistent_keys = self.tier.keys_for(self._prompt_kv(req), req.extra_key)
        return req.persistent_keys

    def _disk_keys(self, seq: Sequence, cached: int) -> Optional[List[bytes]]:
        """The disk blocks to load after a memory prefix of `cached` tokens: their keys, in
        order ([] when none), or None while they are being read."""
        req, bs, tier = seq.request, self.block_size, self.tier
        rid = req.request_id
        keys = self._persistent_keys(req)
        first = cached // bs
        limit = min(len(keys), (seq.num_prompt_tokens - 1) // bs)  # the last token is computed
        if first >= limit:
            tier.release(rid)
            return []
        staged = tier.staged(rid)
        if staged is not None:
            p0 = req.disk_first
            if not staged or not p0 <= first < p0 + len(staged):
                tier.release(rid)  # nothing verified, or memory moved past it
                return []
            return staged[first - p0:]
        if tier.pending(rid):
            return None
        if tier.being_read(keys[first], rid):
            return None  # another request is reading these blocks: wait for its prefix hits
        if req.disk_miss_at == first:
            return []  # looked up already while the request waited for room
        tier.disk_lookup_tokens += (limit - first) * bs
        n = tier.lookup(keys, first, limit)
        if n == 0:
            req.disk_miss_at = first
            return []
        kv = self._prompt_kv(req)
        blocks = [kv[j * bs:(j + 1) * bs] for j in range(first, first + n)]
        if tier.prefetch(rid, keys[first:first + n], blocks, ancestors=keys[:first]):
            req.disk_first = first
            return None
        return []

    def _store_hot(self, seq: Sequence, cached: int, step: _Step) -> None:
        """hot_blocks_threshold N: prompt blocks served from memory for the N-th time are
        written (after this step's forward)."""
        keys = self._persistent_keys(seq.request)
        table = self.kv.block_table(seq.seq_id)
        bs = self.block_size
        last = min(cached // bs, len(keys)) - 1
        for j in range(last + 1):
            if self.tier.note_served(keys[j]):
                toks = self._prompt_kv(seq.request)[j * bs:(j + 1) * bs]
                if self.tier.plan_store(keys[j], toks, keys[j - 1] if j else None,
                                        keys[:j + 1] if j == last else None):
                    step.stores.append((int(table[j]), keys[j]))

    def _plan_stores(self, entries: List[ScheduledSeq], tables: np.ndarray,
                     step: _Step) -> None:
        """hot_blocks_threshold 0: the full prompt blocks this step computes are written."""
        bs = self.block_size
        for i, e in enumerate(entries):
            seq = e.seq
            end = min(e.context_len, seq.num_prompt_tokens)
            if e.start >= end:
                continue
            keys = self._persistent_keys(seq.request)
            last = min(end // bs, len(keys)) - 1  # its chain is touched after its write
            for j in range(e.start // bs, last + 1):
                if (j + 1) * bs <= e.start:
                    continue
                toks = self._prompt_kv(seq.request)[j * bs:(j + 1) * bs]
                if self.tier.plan_store(keys[j], toks, keys[j - 1] if j else None,
                                        keys[:j + 1] if j == last else None):
                    step.stores.append((int(tables[i, j]), keys[j]))

    def _unblock(self, step: _Step) -> None:
        """Nothing was scheduled although work remains: readmit what was just preempted, then
        free idle sequences' blocks (latest first), then fail what can never fit."""
        budget = self.max_num_batched_tokens
        while True:
            budget = self._schedule_swapped(budget, step)
            if not self._swapped_pending():
                self._schedule_waiting(budget, step)
            if step.entries:
                return
            idle = [s for s in self.running if s.num_tokens == s.num_computed_tokens]
            if idle:
                self._preempt(idle[-1], step)
                continue
            if self.running:
                return  # running sequences hold the pool and will make progress
            if self.tier is not None and any(self.tier.pending(s.request.request_id)
                                             for s in self.waiting):
                return  # a prefetch from disk is running: it will be admitted when it lands
            head = next((s for s in self.swapped + self.waiting if not s.is_idle), None)
            if head is None:
                return
            self.fail_request(head.request, self._cannot_fit(head))

    def _cannot_fit(self, seq: Sequence) -> str:
        """Why a sequence that cannot run even alone in the pool is failed, with the numbers."""
        need = -(-(seq.num_tokens + 1) // self.block_size)
        return (f"the request cannot be scheduled: its sequence of {seq.num_tokens} tokens "
                f"needs {need} KV blocks of {self.block_size} tokens and the pool can give "
                f"{self.kv.num_available_blocks} of {self.kv.num_blocks} (watermark "
                f"{self.kv.watermark_blocks}); raise num_kv_blocks / kv_cache_memory_bytes, or "
                f"lower max_tokens, n or beam_width")

    def _pack(self, step: _Step) -> SchedulerOutput:
        """Orders the entries (decodes first), forks best_of requests whose prompt completes,
        and builds the arrays the worker consumes."""
        entries, slots = step.entries, step.slots
        num_seqs = len(entries)
        fast = step.decode is not None and len(step.decode[0]) == num_seqs  # nothing else added
        num_decode = num_seqs if fast else sum(1 for e in entries if e.num_new_tokens == 1)
        if fast:  # the running sequences' fast path: its arrays, no pass over the entries
            seq_ids, starts, toks = step.decode
        else:
            starts = np.fromiter((e.start for e in entries), dtype=np.int64, count=num_seqs)
        if num_decode == num_seqs:  # decode rows only (the common step): nothing to reorder
            q_lens = np.ones(num_seqs, dtype=np.int32)
            cu = np.arange(num_seqs + 1, dtype=np.int32)
        else:
            if step.decode is not None:  # the fast path's one slot array, per entry
                slots = [slots[0][i:i + 1] for i in range(len(step.decode[0]))] + slots[1:]
            order = sorted(range(num_seqs), key=lambda i: entries[i].num_new_tokens != 1)
            entries = [entries[i] for i in order]
            slots = [slots[i] for i in order]
            starts = starts[order]
            q_lens = np.fromiter((e.num_new_tokens for e in entries), dtype=np.int32,
                                 count=num_seqs)
            cu = np.zeros(num_seqs + 1, dtype=np.int32)
            q_lens.cumsum(out=cu[1:])
        num_tokens = int(cu[-1])
        # input_ids / positions: [num_tokens]
        if fast:  # a decode row's input is its last token
            input_ids = toks.astype(np.int64)
            positions = starts
        elif num_decode == num_seqs:
            input_ids = np.fromiter((e.seq.token_ids[e.start] for e in entries), dtype=np.int64,
                                    count=num_seqs)
            positions = starts
        else:
            ids: List[int] = []
            for e in entries:
                ids.extend(e.seq.token_ids[e.start:e.start + e.num_new_tokens])
            input_ids = np.asarray(ids, dtype=np.int64)
            positions = np.repeat(starts - cu[:-1], q_lens) + np.arange(num_tokens)

        sample_rows: List[int] = []
        targets: List[SampleTarget] = []
        beam_rows: List[Tuple[int, Sequence]] = []
        spans: List[Tuple[int, int, int]] = []
        cu_list = cu.tolist()
        for i, e in enumerate(entries):
            seq, req = e.seq, e.seq.request
            if req.prompt_logprobs is not None and e.start < seq.num_prompt_tokens - 1:
                spans.append((i, cu_list[i], cu_list[i + 1]))
            if e.start + e.num_new_tokens != len(seq.token_ids):
                continue  # a prompt chunk short of the end: nothing to sample yet
            row = len(sample_rows)
            sample_rows.append(cu_list[i + 1] - 1)
            if req.beam is not None:
                beam_rows.append((row, seq))
                continue
            if req.params.best_of > 1 and not req.forked:
                req.forked = True
                for index in range(1, req.params.best_of):
                    child = Sequence(req, index, seq.token_ids, req.make_generator(index))
                    req.seqs.append(child)
                    self.kv.fork(seq.seq_id, child.seq_id)
                    if self.cross is not None:
                        self.cross.fork(seq.seq_id, child.seq_id)
                    child.num_computed_tokens = e.start
                    child.sparse_kv = seq.sparse_kv
                    e.forks.append(child)
                    self._run(child)
                targets.extend(SampleTarget(row, s, req.params) for s in [seq, *e.forks])
            else:
                targets.append(SampleTarget(row, seq, req.params))

        if not fast:
            seq_ids = np.fromiter((e.seq.seq_id for e in entries), dtype=np.int64, count=num_seqs)
        context_lens = np.add(starts, q_lens, dtype=np.int32, casting="unsafe")
        # one-token rows still in the prompt (a last chunk, a recomputed cached token): dense
        decode_params = [e.seq.request.params if e.start >= e.seq.num_prompt_tokens else None
                         for e in entries[:num_decode]]
        self.sparse.evict(self.kv, seq_ids[:num_decode], decode_params, context_lens[:num_decode])
        tables = self.kv.block_tables(seq_ids) if entries else np.zeros((0, 0), np.int32)
        sparse = self.sparse.plan(decode_params, context_lens[:num_decode], tables[:num_decode])
        if self.tier is not None and self.tier.hot_blocks_threshold == 0 and entries:
            self._plan_stores(entries, tables, step)
        transfer = KVTransferPlan(
            swap_out=as_pairs(step.swap_out), swap_in=as_pairs(step.swap_in),
            copies=(np.concatenate(step.cow).astype(np.int64) if step.cow else as_pairs([])),
            loads=step.loads, stores=step.stores)
        return SchedulerOutput(
            scheduled=entries,
            num_decode_seqs=num_decode,
            input_ids=input_ids,
            positions=positions,
            slot_mapping=(slots[0] if len(slots) == 1 else np.concatenate(slots) if slots
                          else np.zeros(0, dtype=np.int64)),
            block_tables=tables,
            context_lens=context_lens,
            cu_seqlens_q=cu,
            logits_indices=np.asarray(sample_rows, dtype=np.int64),
            prompt_logit_spans=spans,
            transfer=transfer,
            sample_targets=targets,
            beam_rows=beam_rows,
            preempted=step.preempted,
            multimodal=None if self.encoder is None else self.encoder.step_inputs(
                [(e.seq.request.images, e.start, e.num_new_tokens, int(cu[i]))
                 for i, e in enumerate(entries) if e.seq.request.images]),
            sparse=sparse,
            cross=None if self.cross is None else self.cross.step_inputs(entries, cu),
        )

    # --- applying a step's results -------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, logits: Optional[torch.Tensor],
                           prompt_logits: Dict[int, torch.Tensor],
                           results: List[SampleResult]) -> List[RequestOutput]:
        """Applies one executed step: the only place request and sequence state changes.

        Args:
            out: the step as schedule() returned it.
            logits: float32 [len(out.logits_indices), vocab] on the host (beam rows are read).
            prompt_logits: entry index -> float32 [rows, vocab] for prompt logprobs.
            results: one SampleResult per out.sample_targets, in order.
        Returns:
            A RequestOutput for every non-beam request that got new tokens or finished (only
            the finished ones when stream_outputs is False), plus any failed requests.
        """
        for e in out.scheduled:
            e.seq.num_computed_tokens = e.context_len
            for f in e.forks:
                f.num_computed_tokens = e.context_len
        for i, pl in prompt_logits.items():
            e = out.scheduled[i]
            self.processor.add_prompt_logprobs(e.seq, e.start, pl)

        touched: Dict[str, Request] = {}
        for row, seq in out.beam_rows:
            if seq.is_finished:
                continue
            beam_search.store_candidates(seq, logits[row], seq.request.beam.params)
            touched[seq.request.request_id] = seq.request
        now = time.monotonic()
        apply, finished_status = self.processor.apply, SequenceStatus.FINISHED
        for t, r in zip(out.sample_targets, results):
            seq = t.seq
            if seq.status is finished_status:  # failed this step (a numeric check): no token
                continue
            reason = apply(seq, r, now)
            self.num_generation_tokens += 1
            if reason is not None:
                self._finish(seq, reason)
            touched[seq.request.request_id] = seq.request

        outputs = self.take_failed_outputs()
        for req in touched.values():
            if req.beam is not None:
                if beam_search.ready(req):
                    beam_search.advance(req, self, set(self.eos_token_ids), self.max_model_len,
                                        self._free_beam)
                    self.num_generation_tokens += len(req.seqs)
                continue
            finished = req.finished
            if finished:
                self._drop_request(req.request_id)
            if finished or self.stream_outputs:
                outputs.append(OutputProcessor.request_output(req, finished))
        return outputs

    def _free_beam(self, seq: Sequence) -> None:
        self._finish(seq, "stop")

    def fail_step(self, out: SchedulerOutput, message: str) -> None:
        """Fails the requests of a step that could not run, freeing every block the step
        reserved for them; the other requests carry on."""
        reqs = {e.seq.request.request_id: e.seq.request for e in out.scheduled}
        # Victims swapped out by this step: their copies may not have run.
        reqs.update({s.request.request_id: s.request for s in out.preempted
                     if s.status is SequenceStatus.SWAPPED})
        for req in reqs.values():
            self.fail_request(req, message)
