"""The kernels on torch's OpenMP team (pagedllm.threads): same results, errors, fork safety.

Partitioning of the work depends only on the thread count, so every kernel must give bitwise
the same output on the built-in pool and on torch's team at the same count.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from kernel_reference import attention_ref, make_paged_kv
from pagedllm import _core, threads


@pytest.fixture
def restore_runtime():
    old = _core.get_num_threads()
    yield
    _core.set_num_threads(old)
    threads.share_torch_threads()


def _case(gen, lens, prefill: bool):
    kv = make_paged_kv(gen, lens, 2, 64, 16, "auto", torch.float32)
    n = sum(lens) if prefill else len(lens)
    args = dict(out=torch.zeros((n, 8, 64)), query=torch.randn((n, 8, 64), generator=gen),
                key_cache=kv.key_cache, value_cache=kv.value_cache, block_tables=kv.block_tables,
                context_lens=kv.context_lens, scale=0.125)
    if prefill:
        cu = [0]
        for length in lens:
            cu.append(cu[-1] + length)
        args["cu_seqlens_q"] = torch.tensor(cu, dtype=torch.int32)
    return kv, args


def _run(args, prefill: bool) -> torch.Tensor:
    a = dict(args, out=torch.zeros_like(args["out"]))
    (_core.paged_attention_prefill if prefill else _core.paged_attention_decode)(**a)
    return a["out"]


def test_the_engine_default_is_torchs_openmp_team(restore_runtime):
    assert torch.backends.openmp.is_available()
    assert threads.share_torch_threads().startswith("openmp:")
    assert _core.parallel_runtime().startswith("openmp:")
    assert threads.set_num_threads(3) == 3
    assert _core.get_num_threads() == 3 and torch.get_num_threads() == 3


@pytest.mark.parametrize("prefill", [False, True])
@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_bitwise_equal_on_both_runtimes(restore_runtime, prefill, num_threads):
    gen = torch.Generator().manual_seed(3 + num_threads)
    lens = [37, 150, 3000, 5] if not prefill else [37, 150, 400]
    kv, args = _case(gen, lens, prefill)
    _core.set_num_threads(num_threads)
    _core.use_builtin_pool()
    builtin = _run(args, prefill)
    assert _core.adopt_loaded_openmp()
    team = _run(args, prefill)
    assert torch.equal(builtin, team)
    if not prefill:  # and right, against the float64 reference
        for s, length in enumerate(lens):
            ref = attention_ref(args["query"][s:s + 1], kv.k_full[s], kv.v_full[s], 0.125,
                                torch.tensor([length - 1]))
            assert torch.allclose(team[s:s + 1], ref.float(), atol=1e-5)


def test_errors_leave_the_team_usable(restore_runtime):
    assert _core.adopt_loaded_openmp()
    gen = torch.Generator().manual_seed(5)
    kv, args = _case(gen, [20, 40], False)
    before = _run(args, False)
    bad = dict(args, context_lens=torch.tensor([20, 10_000], dtype=torch.int32))
    with pytest.raises((ValueError, IndexError)):
        _core.paged_attention_decode(**bad)
    after = _run(args, False)
    assert torch.equal(after, before)
    ref = attention_ref(args["query"][1:2], kv.k_full[1], kv.v_full[1], 0.125, torch.tensor([39]))
    assert torch.allclose(after[1:2], ref.float(), atol=1e-5)


def _decode_in_child(queue, args):
    adopted = _core.adopt_loaded_openmp()  # refused: the parent's team is gone in a child
    queue.put((adopted, _core.parallel_runtime(), _run(args, False).numpy().copy()))


def test_forked_child_after_the_team_ran(restore_runtime):
    """The parent ran kernels on the OpenMP team; a forked child must not hang on it."""
    assert _core.adopt_loaded_openmp()
    gen = torch.Generator().manual_seed(6)
    _, args = _case(gen, [300, 70], False)
    want = _run(args, False)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_decode_in_child, args=(queue, args))
    child.start()
    adopted, runtime, got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert not adopted and runtime == "builtin"
    assert torch.allclose(torch.from_numpy(got), want, atol=1e-6)


def test_concurrent_python_threads_on_the_team(restore_runtime):
    import threading

    assert _core.adopt_loaded_openmp()
    gen = torch.Generator().manual_seed(7)
    runs = [_case(gen, [64 + 30 * i, 9], False)[1] for i in range(4)]
    expected = [_run(a, False) for a in runs]
    got = [None] * len(runs)

    def work(i):
        for _ in range(10):
            got[i] = _run(runs[i], False)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(runs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_runtime_choice_from_the_environment(restore_runtime, monkeypatch):
    monkeypatch.setenv(threads.RUNTIME_ENV, "builtin")
    assert threads.share_torch_threads() == "builtin"
    monkeypatch.setenv(threads.RUNTIME_ENV, "openmp")
    assert threads.share_torch_threads().startswith("openmp:")
    monkeypatch.setenv(threads.RUNTIME_ENV, "tbb")
    with pytest.raises(ValueError, match="PAGEDLLM_THREAD_RUNTIME='tbb'.*openmp"):
        threads.share_torch_threads()
