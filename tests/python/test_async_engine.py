"""AsyncLLMEngine: one engine thread, requests joining the running batch, aborts, failures.

The engine is ScriptedEngine (server_fixtures): LLMEngine's request API with a scripted model,
so these tests check the threading and delivery machinery exactly and fast.
"""

import asyncio
import concurrent.futures
import threading
import time

import pytest

from pagedllm.engine.async_engine import AsyncLLMEngine, EngineDeadError, RequestStream, _Add
from pagedllm.sampling_params import SamplingParams
from server_fixtures import ScriptedEngine, scripted_completion


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def prompt(text):
    return {"prompt_token_ids": ScriptedEngine().tokenizer.encode(text)}


@pytest.fixture
def engine():
    sync = ScriptedEngine(step_delay=0.001)
    eng = AsyncLLMEngine(sync)
    yield eng
    eng.shutdown(timeout=10)


def test_only_the_engine_thread_touches_the_engine(engine):
    async def go():
        outs = []
        async for out in engine.generate("a", prompt("hello"), SamplingParams(max_tokens=5)):
            outs.append(out)
        return outs

    outs = run(go())
    assert outs[-1].finished
    assert outs[-1].outputs[0].text == scripted_completion(prompt("hello")["prompt_token_ids"], 5)
    assert engine.engine.thread_ids == {engine._thread.ident}
    assert engine._thread.ident != threading.get_ident()


def test_a_request_joins_the_running_batch():
    sync = ScriptedEngine(step_delay=0.005)
    eng = AsyncLLMEngine(sync)

    async def go():
        long = await eng.add_request("long", prompt("x"), SamplingParams(max_tokens=60))
        first = await long.__anext__()
        short = await eng.add_request("short", prompt("y"), SamplingParams(max_tokens=3))
        short_outs = [o async for o in short]
        long_outs = [first] + [o async for o in long]
        return short_outs, long_outs

    try:
        short_outs, long_outs = run(go())
    finally:
        eng.shutdown(10)
    assert short_outs[-1].finished and len(short_outs[-1].outputs[0].token_ids) == 3
    # The short request finished while the long one was still running: it joined the batch.
    assert long_outs[-1].finished and len(long_outs[-1].outputs[0].token_ids) == 60
    assert sync.num_steps < 60 + 3


def test_rejected_request_raises_value_error_and_engine_keeps_going(engine):
    async def go():
        with pytest.raises(ValueError, match="exceeds max_model_len"):
            await engine.add_request("big", prompt("p"), SamplingParams(max_tokens=10_000))
        return [o async for o in engine.generate("ok", prompt("p"), SamplingParams(max_tokens=2))]

    outs = run(go())
    assert outs[-1].finished


def test_abort_mid_stream_ends_the_stream_and_frees_blocks(engine):
    async def go():
        stream = await engine.add_request("r", prompt("abc"), SamplingParams(max_tokens=400))
        await stream.__anext__()
        engine.abort("r")
        rest = [o async for o in stream]
        return stream, rest

    stream, rest = run(go())
    assert stream.aborted and not stream.finished
    assert all(not o.finished for o in rest)
    _wait(lambda: engine.stats()["used_blocks"] == 0 and not engine.engine.requests)
    assert engine.stats()["num_requests_running"] == 0


def test_leaving_generate_early_aborts_the_request(engine):
    async def go():
        agen = engine.generate("g", prompt("abc"), SamplingParams(max_tokens=400))
        async for _ in agen:
            break
        await agen.aclose()

    run(go())
    _wait(lambda: not engine.engine.requests)


def test_slow_reader_gets_every_token(engine):
    async def go():
        stream = await engine.add_request("s", prompt("slow"), SamplingParams(max_tokens=30))
        await asyncio.sleep(0.2)  # many steps pass; the stream keeps only the newest output
        return [o async for o in stream]

    outs = run(go())
    assert len(outs) < 30
    assert outs[-1].finished
    assert outs[-1].outputs[0].text == scripted_completion(prompt("slow")["prompt_token_ids"], 30)


def test_engine_thread_sleeps_when_idle(engine):
    run(_drain(engine, "w", 3))
    steps = engine.engine.num_steps
    time.sleep(0.1)
    assert engine.engine.num_steps == steps
    run(_drain(engine, "w2", 3))  # and wakes up for new work
    assert engine.engine.num_steps == steps + 3


def test_step_failure_fails_streams_and_refuses_new_requests(engine):
    async def go():
        stream = await engine.add_request("f", prompt("abc"), SamplingParams(max_tokens=400))
        await stream.__anext__()
        engine.engine.fail_next_step = True
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await engine.add_request("late", prompt("abc"), SamplingParams(max_tokens=1))

    run(go())
    assert isinstance(engine.dead_error, RuntimeError)
    assert not engine.is_running


def test_shutdown_ends_open_streams_as_aborted_and_frees_requests():
    sync = ScriptedEngine(step_delay=0.002)
    eng = AsyncLLMEngine(sync)

    async def go():
        stream = await eng.add_request("s", prompt("abc"), SamplingParams(max_tokens=400))
        await stream.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, eng.shutdown, 10)
        rest = [o async for o in stream]
        with pytest.raises(EngineDeadError, match="shut down"):
            await eng.add_request("late", prompt("abc"), SamplingParams(max_tokens=1))
        return stream, rest

    stream, rest = run(go())
    assert stream.aborted
    assert not sync.requests
    assert eng.stats()["used_blocks"] == 0


def test_stats_snapshot_counts_tokens(engine):
    run(_drain(engine, "t", 4))
    s = engine.stats()
    assert s["num_generation_tokens"] == 4
    assert s["num_prompt_tokens"] == len(prompt("t")["prompt_token_ids"])
    assert s["num_requests_running"] == 0


async def _drain(engine, rid, n):
    return [o async for o in engine.generate(rid, prompt(rid), SamplingParams(max_tokens=n))]


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_add_racing_a_shutdown_fails_instead_of_hanging():
    # add_request checked the engine, then the thread stopped before the add was posted.
    eng = AsyncLLMEngine(ScriptedEngine())
    eng.start()
    eng.shutdown(10)

    async def go():
        stream = RequestStream("r", asyncio.get_running_loop())
        accepted = concurrent.futures.Future()
        eng._post(_Add("r", prompt("x"), SamplingParams(max_tokens=1), None, 0, stream, accepted))
        with pytest.raises(EngineDeadError):
            await asyncio.wrap_future(accepted)

    run(go())
