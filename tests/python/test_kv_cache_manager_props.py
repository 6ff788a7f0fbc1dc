"""Property-based tests of KVCacheManager against a plain Python model of its rules.

Random sequences of allocate / append / append_batch / fork / free / evict / reset run on small
pools. After every operation the manager is checked against the model:
- each block's refcount equals the number of block tables holding it;
- no block is both free and referenced (used + cached + free == capacity, used == referenced);
- the slots of live tokens never collide: a simulated physical KV store, written through the
  returned slots (copy-on-write pairs applied first), holds at every live position exactly the
  content that the sequence's own prefix would produce;
- a prefix hit returns blocks whose stored tokens equal the request's (checked via that store);
- tokens_stored equals the tokens held in referenced blocks;
and after everything is freed, free + cached == capacity.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedllm import _core

STEPS_PER_EXAMPLE = 50
EXAMPLES = 2600  # up to 2600 x 50 operations; test_enough_operations checks the total
MIN_OPERATIONS = 100_000
OPERATIONS = [0]  # rules executed in this process (a list so rules can increment it)


class ModelSeq:
    """What the model knows of a live sequence: its tokens and extra key."""

    def __init__(self, tokens: list[int], extra_key: int):
        self.tokens = list(tokens)
        self.extra_key = extra_key


class KVManagerMachine(RuleBasedStateMachine):
    """Drives a KVCacheManager and the model side by side."""

    @initialize(
        num_blocks=st.integers(min_value=1, max_value=24),
        block_size=st.sampled_from([1, 2, 3, 4]),
        prefix=st.booleans(),
        watermark=st.integers(min_value=0, max_value=2),
    )
    def setup(self, num_blocks, block_size, prefix, watermark):
        watermark = min(watermark, num_blocks - 1)
        self.bs = block_size
        self.num_blocks = num_blocks
        self.prefix = prefix
        self.m = _core.KVCacheManager(num_blocks, block_size, prefix, watermark)
        self.seqs: dict[int, ModelSeq] = {}
        self.phys: dict[int, tuple] = {}  # slot -> content identity (prefix + extra key)
        self.next_id = 0

    # --- helpers ------------------------------------------------------------------------------
    @staticmethod
    def content(seq: ModelSeq, pos: int) -> tuple:
        # K/V at a position depend on every token up to it (and on the extra key).
        return (seq.extra_key, tuple(seq.tokens[: pos + 1]))

    def slot(self, seq_id: int, pos: int) -> int:
        table = self.m.block_table(seq_id)
        return int(table[pos // self.bs]) * self.bs + pos % self.bs

    def apply_writes(self, cow, writes):
        # The engine copies blocks before the step's writes: do the same.
        for src, dst in cow:
            for off in range(self.bs):
                s = int(src) * self.bs + off
                d = int(dst) * self.bs + off
                if s in self.phys:
                    self.phys[d] = self.phys[s]
                else:
                    self.phys.pop(d, None)
        for slot, value in writes:
            self.phys[int(slot)] = value

    def new_prompt(self, data, max_len):
        # Tokens from a tiny alphabet with common prefixes, so prefix hits are frequent.
        family = data.draw(st.integers(0, 2))
        n = data.draw(st.integers(1, max_len))
        return [(family * 7 + i * (1 + (i > 5 and family == 2))) % 11 for i in range(n)]

    # --- rules --------------------------------------------------------------------------------
    @rule(data=st.data())
    def allocate(self, data):
        self.count()
        prompt = self.new_prompt(data, 3 * self.bs + 2)
        extra = data.draw(st.sampled_from([0, 0, 0, 9]))
        chunk = data.draw(st.integers(0, len(prompt)))
        can = self.m.can_allocate(prompt, extra, chunk)
        expected_cached = self.m.num_cached_tokens(prompt, extra)
        assert expected_cached % self.bs == 0 and expected_cached <= len(prompt) - 1
        if not self.prefix:
            assert expected_cached == 0
        if not can:
            return
        sid = self.next_id
        self.next_id += 1
        cached = self.m.allocate(sid, prompt, extra)
        assert cached == expected_cached
        seq = ModelSeq(prompt[:cached], extra)
        self.seqs[sid] = seq
        # A prefix hit must hold exactly this request's content.
        for pos in range(cached):
            assert self.phys.get(self.slot(sid, pos)) == self.content(ModelSeq(prompt, extra), pos)
        todo = min(chunk, len(prompt) - cached)
        if todo:
            self.do_append(sid, prompt[cached : cached + todo], must_fit=True)

    @rule(data=st.data())
    def admit(self, data):
        # The engine's path: hashes once, one ask (query_admission), one do (admit); it must
        # agree with the can_allocate / allocate / append path and with the model.
        self.count()
        prompt = self.new_prompt(data, 3 * self.bs + 2)
        extra = data.draw(st.sampled_from([0, 0, 0, 9]))
        max_cached = data.draw(st.sampled_from([0, len(prompt), self.bs]))
        want = data.draw(st.integers(0, len(prompt)))
        arr = np.array(prompt, dtype=np.int32)
        hashes = self.m.block_hashes(arr, extra)
        assert len(hashes) == len(prompt) // self.bs
        given = hashes[: data.draw(st.integers(0, len(hashes)))]  # the rest hashed inside
        cached, fit = self.m.query_admission(arr, given, extra, max_cached, want)
        assert cached % self.bs == 0 and cached <= max(min(len(prompt) - 1, max_cached), 0)
        if max_cached >= len(prompt):
            assert cached == self.m.num_cached_tokens(prompt, extra)
        assert 0 <= fit <= min(want, len(prompt) - cached)
        if max_cached >= len(prompt) and 0 < fit == min(want, len(prompt) - cached):
            assert self.m.can_allocate(prompt, extra, fit)  # the two asks agree
        n = data.draw(st.integers(0, fit))
        sid = self.next_id
        self.next_id += 1
        res = self.m.admit(sid, arr, given, extra, max_cached, n)
        assert res is not None  # query_admission promised room
        got_cached, slots, cow = res
        assert got_cached == cached and len(slots) == n and len(cow) == 0
        seq = ModelSeq(prompt[:cached], extra)
        self.seqs[sid] = seq
        for pos in range(cached):
            assert self.phys.get(self.slot(sid, pos)) == self.content(ModelSeq(prompt, extra), pos)
        seq.tokens.extend(prompt[cached:cached + n])
        self.apply_writes([], [(sl, self.content(seq, cached + i)) for i, sl in enumerate(slots)])

    def do_append(self, sid, tokens, must_fit=False):
        seq = self.seqs[sid]
        need = self.m.blocks_needed(sid, len(tokens))
        fits = need <= self.m.num_available_blocks
        assert self.m.can_append(sid, len(tokens)) == fits
        res = self.m.append(sid, np.array(tokens, dtype=np.int32))
        if must_fit:
            assert res is not None
        if res is None:
            assert not fits
            return
        slots, cow = res
        assert len(slots) == len(tokens)
        start = len(seq.tokens)
        seq.tokens.extend(tokens)
        writes = [(s, self.content(seq, start + i)) for i, s in enumerate(slots)]
        self.apply_writes(cow, writes)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def append(self, data):
        self.count()
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        n = data.draw(st.integers(0, 2 * self.bs + 1))
        self.do_append(sid, [data.draw(st.integers(0, 10)) for _ in range(n)])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def append_batch(self, data):
        self.count()
        ids = data.draw(st.lists(st.sampled_from(sorted(self.seqs)), min_size=1, unique=True))
        counts = [data.draw(st.integers(0, self.bs + 1)) for _ in ids]
        toks = [[data.draw(st.integers(0, 10)) for _ in range(c)] for c in counts]
        flat = np.array([t for ts in toks for t in ts], dtype=np.int32)
        need = sum(self.m.blocks_needed(i, c) for i, c in zip(ids, counts))
        res = self.m.append_batch(np.array(ids, dtype=np.int64), np.array(counts, dtype=np.int32), flat)
        if res is None:
            assert need > self.m.num_available_blocks
            return
        slots, cow = res
        writes, k = [], 0
        for sid, ts in zip(ids, toks):
            seq = self.seqs[sid]
            start = len(seq.tokens)
            seq.tokens.extend(ts)
            for i in range(len(ts)):
                writes.append((slots[k], self.content(seq, start + i)))
                k += 1
        self.apply_writes(cow, writes)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        self.count()
        parent = data.draw(st.sampled_from(sorted(self.seqs)))
        child = self.next_id
        self.next_id += 1
        self.m.fork(parent, child)
        p = self.seqs[parent]
        self.seqs[child] = ModelSeq(p.tokens, p.extra_key)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        self.count()
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        self.m.free(sid)
        del self.seqs[sid]

    @rule()
    def evict(self):
        self.count()
        # Claim every available block with a throwaway sequence: forces LRU eviction of all
        # parked blocks. Then give them back.
        avail = self.m.num_available_blocks
        if avail == 0:
            return
        sid = self.next_id
        self.next_id += 1
        filler = [100 + i for i in range(avail * self.bs)]
        self.m.allocate(sid, filler[:1])
        res = self.m.append(sid, np.array(filler, dtype=np.int32))
        assert res is not None
        assert self.m.stats()["cached_blocks"] == 0
        self.seqs[sid] = ModelSeq(filler, 0)
        self.apply_writes(res[1], [(s, self.content(self.seqs[sid], i)) for i, s in enumerate(res[0])])
        self.m.free(sid)
        del self.seqs[sid]

    @rule()
    def reset(self):
        self.count()
        self.m.reset_prefix_cache()
        assert self.m.stats()["cached_blocks"] == 0

    def count(self):
        OPERATIONS[0] += 1

    # --- invariants ---------------------------------------------------------------------------
    @invariant()
    def consistent(self):
        holders: dict[int, int] = {}
        stored = 0
        fill: dict[int, int] = {}
        for sid, seq in self.seqs.items():
            table = self.m.block_table(sid)
            assert self.m.num_tokens(sid) == len(seq.tokens)
            assert len(table) == -(-len(seq.tokens) // self.bs)
            for i, b in enumerate(table.tolist()):
                holders[b] = holders.get(b, 0) + 1
                in_block = min(self.bs, len(seq.tokens) - i * self.bs)
                assert fill.setdefault(b, in_block) == in_block  # sharers agree on the fill
            for pos in range(len(seq.tokens)):
                assert self.phys.get(self.slot(sid, pos)) == self.content(seq, pos), (sid, pos)
        stored = sum(fill.values())
        for b in range(self.num_blocks):
            assert self.m.refcount(b) == holders.get(b, 0)
        s = self.m.stats()
        assert s["used_blocks"] == len(holders)
        assert s["used_blocks"] + s["cached_blocks"] + s["free_blocks"] == self.num_blocks
        assert s["tokens_stored"] == stored
        assert s["num_seqs"] == len(self.seqs)
        for b in holders:
            assert not self.m.is_parked(b)

    def teardown(self):
        if not hasattr(self, "m"):
            return
        for sid in list(self.seqs):
            self.m.free(sid)
        s = self.m.stats()
        assert s["used_blocks"] == 0
        assert s["free_blocks"] + s["cached_blocks"] == self.num_blocks
        assert s["tokens_stored"] == 0


KVManagerMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS_PER_EXAMPLE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=False,
)
TestKVManagerProperties = KVManagerMachine.TestCase


def test_enough_operations():
    """The property run above executed at least MIN_OPERATIONS operations."""
    assert OPERATIONS[0] >= MIN_OPERATIONS, OPERATIONS[0]
