"""Continuous batching over the paged KV cache.

Every step the scheduler picks what to compute under two budgets, ``max_num_batched_tokens``
and ``max_num_seqs``:
1. running sequences first, in arrival order: one token for a decoding sequence, the next chunk
   of the prompt for one still in prefill (chunked prefill, so a long prompt never stalls the
   decodes). Slots come from ``KVCacheManager.append``; when the pool runs out, the
   latest-arrived running sequence is preempted (its blocks freed, to be recomputed later, its
   own prefix mostly still cached) until the append fits;
2. then, if nothing was preempted, waiting sequences in arrival order, as long as their first
   chunk fits and the watermark stays free (prefix-cache hits are taken at admission).

The scheduler touches no tensor: it returns token positions, slots, block tables and
copy-on-write pairs as numpy arrays in a SchedulerOutput, decodes first.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import List

import numpy as np

from pagedllm import _core
from pagedllm.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """One sequence's share of a step.

    Attributes:
        seq: the sequence.
        start: position of its first new token (== num_computed_tokens before the step).
        num_new_tokens: tokens computed for it in this step.
    """

    seq: Sequence
    start: int
    num_new_tokens: int

    @property
    def context_len(self) -> int:
        """Tokens of context once this step has run (cached + new)."""
        return self.start + self.num_new_tokens


@dataclass
class SchedulerOutput:
    """What one step computes.

    Attributes:
        scheduled: the sequences, the num_decode_seqs single-token ones first.
        num_decode_seqs: how many leading entries have exactly one new token.
        slot_mapping: int64 [num_tokens], the cache slot of every new token, in batch order.
        block_tables: int32 [num_seqs, max_blocks], padded with 0.
        cow_pairs: int32 [k, 2], (src, dst) blocks to copy before the step runs.
        preempted: sequences preempted while scheduling this step.
    """

    scheduled: List[ScheduledSeq]
    num_decode_seqs: int
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    cow_pairs: np.ndarray
    preempted: List[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Decides, step by step, which tokens of which sequences to compute.

    Args:
        kv: the KV-cache manager (the scheduler's only view of memory).
        max_num_seqs: most sequences in one step.
        max_num_batched_tokens: most new tokens in one step.
    """

    def __init__(self, kv: _core.KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: List[Sequence] = []  # sorted by arrival_key
        self.running: List[Sequence] = []  # sorted by arrival_key
        self.num_preemptions = 0

    # --- queue management ---------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queues a sequence that holds no blocks (new or preempted), in arrival order."""
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.arrival_key)

    def add_running(self, seq: Sequence) -> None:
        """Adds a sequence that already holds blocks (a fork) to the running set."""
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival_key)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Makes `child` share every KV block of the running `parent` (copy-on-write later)."""
        assert parent.status is SequenceStatus.RUNNING, parent
        self.kv.fork(parent.seq_id, child.seq_id)
        child.num_computed_tokens = parent.num_computed_tokens
        self.add_running(child)

    def remove(self, seq: Sequence) -> None:
        """Drops a sequence from the queues and frees its blocks (finished or aborted)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.kv.free(seq.seq_id)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- scheduling ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Picks this step's work and reserves its slots. See the module docstring."""
        budget = self.max_num_batched_tokens
        entries: List[ScheduledSeq] = []
        slots: List[np.ndarray] = []
        cow: List[np.ndarray] = []
        preempted: List[Sequence] = []

        budget = self._schedule_running(budget, entries, slots, cow, preempted)
        if not preempted:
            self._schedule_waiting(budget, entries, slots, cow)

        # Decodes (one new token) first, as the attention wrapper expects.
        order = sorted(range(len(entries)), key=lambda i: entries[i].num_new_tokens != 1)
        entries = [entries[i] for i in order]
        slots = [slots[i] for i in order]
        num_decode = sum(1 for e in entries if e.num_new_tokens == 1)
        seq_ids = np.fromiter((e.seq.seq_id for e in entries), dtype=np.int64, count=len(entries))
        return SchedulerOutput(
            scheduled=entries,
            num_decode_seqs=num_decode,
            slot_mapping=np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64),
            block_tables=self.kv.block_tables(seq_ids) if entries else np.zeros((0, 0), np.int32),
            cow_pairs=np.concatenate(cow) if cow else np.zeros((0, 2), dtype=np.int32),
            preempted=preempted,
        )

    def _schedule_running(self, budget, entries, slots, cow, preempted) -> int:
        todo = [s for s in self.running if s.num_tokens > s.num_computed_tokens]
        if not todo:
            return budget
        # Fast path: every running sequence decodes one token and the pool has room.
        if all(s.num_tokens - s.num_computed_tokens == 1 for s in todo) and len(todo) <= budget:
            ids = np.fromiter((s.seq_id for s in todo), dtype=np.int64, count=len(todo))
            toks = np.fromiter((s.token_ids[-1] for s in todo), dtype=np.int32, count=len(todo))
            res = self.kv.append_batch(ids, np.ones(len(todo), dtype=np.int32), toks)
            if res is not None:
                all_slots, pairs = res
                for i, s in enumerate(todo):
                    entries.append(ScheduledSeq(s, s.num_computed_tokens, 1))
                    slots.append(all_slots[i:i + 1])
                if len(pairs):
                    cow.append(pairs)
                return budget - len(todo)
        # Slow path: one sequence at a time, preempting the latest arrivals when out of blocks.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n == 0:
                i += 1
                continue
            start = seq.num_computed_tokens
            res = None
            while res is None:
                res = self.kv.append(seq.seq_id, seq.token_ids[start:start + n])
                if res is None:
                    victim = self.running[-1]
                    self._preempt(victim, preempted)
                    if victim is seq:
                        break
            if res is None:
                break  # the current sequence was itself the latest arrival
            entries.append(ScheduledSeq(seq, start, n))
            slots.append(res[0])
            if len(res[1]):
                cow.append(res[1])
            budget -= n
            i += 1
        return budget

    def _preempt(self, seq: Sequence, preempted) -> None:
        # The victim is the latest arrival, running[-1], at or after the sequence being
        # scheduled: nothing of it is in this step's entries yet.
        self.running.remove(seq)
        self.kv.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        preempted.append(seq)
        self.add(seq)

    def _schedule_waiting(self, budget, entries, slots, cow) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            extra = seq.request.extra_key
            # Prompt logprobs need logits at every prompt position: no prefix hits for those.
            lookup = seq.token_ids[:1] if seq.request.prompt_logprobs is not None else seq.token_ids
            cached = self.kv.num_cached_tokens(lookup, extra)
            n = min(seq.num_tokens - cached, budget)
            if not self.kv.can_allocate(lookup, extra, n):
                # With nothing running, admit a smaller first chunk rather than stall forever.
                n = min(n, self.kv.block_size)
                if self.running or not self.kv.can_allocate(lookup, extra, n):
                    break
            self.waiting.pop(0)
            cached = self.kv.allocate(seq.seq_id, lookup, extra)
            seq.num_computed_tokens = cached
            res = self.kv.append(seq.seq_id, seq.token_ids[cached:cached + n])
            assert res is not None, "can_allocate promised room"
            entries.append(ScheduledSeq(seq, cached, n))
            slots.append(res[0])
            if len(res[1]):
                cow.append(res[1])
            budget -= n
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=lambda s: s.arrival_key)
