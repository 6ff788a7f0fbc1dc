"""Scheduler unit tests: budgets, chunked prefill, decode-first order, preemption, prefix hits.

The model is not involved: after each step the test hands the scheduler a made-up sampled
token for every draw (update_from_output, as the engine does after the forward).
"""

import numpy as np
import pytest

from pagedllm import _core
from pagedllm.engine.sampler import SampleResult
from pagedllm.engine.scheduler import Scheduler
from pagedllm.engine.sequence import Request, SequenceStatus
from pagedllm.sampling_params import SamplingParams


def make_request(rid, prompt, max_tokens=8):
    return Request(str(rid), None, prompt, SamplingParams(max_tokens=max_tokens))


def run_step(sched, new_token=7):
    out = sched.schedule()
    sched.update_from_output(out, None, {}, [SampleResult(new_token) for _ in out.sample_targets])
    return out


def test_chunked_prefill_respects_token_budget_and_puts_decodes_first():
    kv = _core.KVCacheManager(64, 4)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=10)
    short = make_request(0, list(range(3)))
    long = make_request(1, list(range(100, 125)))  # 25 tokens: 3 chunks under a budget of 10
    sched.add_request(short)
    sched.add_request(long)
    out = run_step(sched)
    assert [(e.seq.request.request_id, e.start, e.num_new_tokens) for e in out.scheduled] == [
        ("0", 0, 3), ("1", 0, 7)]
    assert out.num_tokens == 10
    out = run_step(sched)
    # The short prompt now decodes (one token, first); the long one gets the rest of the budget.
    assert [(e.seq.request.request_id, e.start, e.num_new_tokens) for e in out.scheduled] == [
        ("0", 3, 1), ("1", 7, 9)]
    assert out.num_decode_seqs == 1
    out = run_step(sched)
    assert [(e.seq.request.request_id, e.num_new_tokens) for e in out.scheduled] == [("0", 1), ("1", 9)]
    # Slots handed out match the block tables.
    for e, row in zip(out.scheduled, out.block_tables):
        assert e.context_len <= np.count_nonzero(row >= 0) * 4


def test_slot_mapping_and_tables_agree():
    kv = _core.KVCacheManager(16, 4)
    sched = Scheduler(kv, 4, 64)
    r = make_request(0, list(range(10)))
    sched.add_request(r)
    out = sched.schedule()
    table = out.block_tables[0]
    expected = [int(table[p // 4]) * 4 + p % 4 for p in range(10)]
    assert out.slot_mapping.tolist() == expected


def test_preempts_latest_arrival_when_out_of_blocks():
    kv = _core.KVCacheManager(6, 2, enable_prefix_caching=False)
    sched = Scheduler(kv, 8, 64)
    reqs = [make_request(i, [i * 10 + j for j in range(4)]) for i in range(3)]  # 2 blocks each
    for r in reqs:
        sched.add_request(r)
    run_step(sched)  # all three prompts: 6 blocks, pool full
    assert kv.num_available_blocks == 0
    out = run_step(sched)  # each needs a 3rd block: the latest arrival is preempted
    assert [s.request.request_id for s in out.preempted] == ["2"]
    assert reqs[2].seqs[0].status is SequenceStatus.WAITING
    assert reqs[2].seqs[0].num_computed_tokens == 0
    assert sched.num_preemptions == 1
    assert [e.seq.request.request_id for e in out.scheduled] == ["0", "1"]
    # Freeing one sequence lets the preempted one be recomputed (prompt + generated token).
    sched.abort_request("0")
    out = run_step(sched)
    ids = [(e.seq.request.request_id, e.num_new_tokens) for e in out.scheduled]
    assert ("2", 5) in ids


def test_admission_takes_prefix_hits():
    kv = _core.KVCacheManager(32, 4)
    sched = Scheduler(kv, 8, 64)
    shared = list(range(12))
    a = make_request(0, shared + [50])
    sched.add_request(a)
    run_step(sched)
    b = make_request(1, shared + [60, 61])
    sched.add_request(b)
    out = run_step(sched)
    entry = [e for e in out.scheduled if e.seq is b.seqs[0]][0]
    assert entry.start == 12 and entry.num_new_tokens == 2  # 3 cached blocks reused
    assert kv.stats()["prefix_cache_hits"] == 12


def test_waiting_admission_is_fcfs_and_capped_by_max_num_seqs():
    kv = _core.KVCacheManager(64, 4)
    sched = Scheduler(kv, max_num_seqs=2, max_num_batched_tokens=64)
    reqs = [make_request(i, [1, 2, 3]) for i in range(4)]
    for r in reversed(reqs):  # added out of order: arrival order still decides
        sched.add_request(r)
    out = run_step(sched)
    # Requests 0 and 1 were created (arrived) first.
    assert [e.seq.request.request_id for e in out.scheduled] == ["0", "1"]
    assert len(sched.running) == 2


def test_nothing_to_schedule_is_empty():
    kv = _core.KVCacheManager(4, 4)
    sched = Scheduler(kv, 2, 8)
    out = sched.schedule()
    assert out.is_empty and out.num_tokens == 0


def test_grouped_requests_are_admitted_fairly():
    # One client's six prompts (group "big") arrive before another's one (group "small"):
    # with room for four sequences, the small one is admitted in the first step.
    kv = _core.KVCacheManager(64, 4)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    big = [Request(f"big-{i}", None, [1, 2, 3], SamplingParams(max_tokens=4), group="big")
           for i in range(6)]
    small = Request("small-0", None, [4, 5], SamplingParams(max_tokens=4), group="small")
    for r in big + [small]:
        sched.add_request(r)
    out = run_step(sched)
    ids = [e.seq.request.request_id for e in out.scheduled]
    assert ids == ["big-0", "small-0", "big-1", "big-2"], ids
    # Without groups: arrival order.
    kv2 = _core.KVCacheManager(64, 4)
    fcfs = Scheduler(kv2, max_num_seqs=4, max_num_batched_tokens=64)
    reqs = [make_request(i, [1, 2, 3]) for i in range(6)]
    for r in reqs:
        fcfs.add_request(r)
    out = run_step(fcfs)
    assert [e.seq.request.request_id for e in out.scheduled] == ["0", "1", "2", "3"]


def test_a_sequence_that_cannot_fit_an_empty_pool_is_failed_with_the_numbers():
    # The engine refuses such requests at add_request; the scheduler still never stalls on one.
    kv = _core.KVCacheManager(4, 4)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    big = make_request("big", list(range(30)))  # 30 tokens need 8 blocks of 4; the pool has 4
    ok = make_request("ok", [1, 2, 3])
    sched.add_request(big)
    sched.add_request(ok)
    failed = []
    for _ in range(20):  # "ok" runs; "big" is admitted chunk by chunk until it cannot grow
        out = sched.schedule()
        failed += sched.update_from_output(out, None, {},
                                           [SampleResult(7) for _ in out.sample_targets])
        failed = [f for f in failed if f.error is not None]
        if failed:
            break
    assert [f.request_id for f in failed] == ["big"]
    assert failed[0].outputs[0].finish_reason == "error"
    assert "needs" in failed[0].error and "KV blocks" in failed[0].error
    assert "num_kv_blocks" in failed[0].error
    assert big.seqs[0].is_finished and big.seqs[0].seq_id not in kv  # its blocks are back
