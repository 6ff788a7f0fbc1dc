"""Timeline traces (issue 17): the trace JSON parses and holds the expected spans, in order and
nested; the file is valid after every flush; the torch.profiler window; option errors; NVTX
ranges and the cudaProfilerStart/Stop window with the CUDA modules mocked (CPU)."""

from __future__ import annotations

import json

import pytest

from engine_fixtures import engine_model_dir  # noqa: F401
from engine_fixtures import assert_pool_clean, greedy, mixed_prompts, tok
from pagedllm import LLM, SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.engine import profile_windows, tracing
from pagedllm.engine.trace_options import TraceOptions, parse_step_window
from trace_fixtures import assert_properly_nested, assert_step_structure, spans


def test_trace_spans_are_present_ordered_and_nested(engine_model_dir, tmp_path):
    path = tmp_path / "trace.json"
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64, profile_trace=str(path),
              profile_layers=True, check_numerics="fail")
    with pytest.raises(RuntimeError, match="already"):
        llm.start_trace(str(path))
    # n=2 samples share the prompt's last, partial block: a copy-on-write copy (kv.copy).
    params = SamplingParams(n=2, temperature=0.8, max_tokens=4, ignore_eos=True, seed=1)
    llm.generate(tok(mixed_prompts(3, seed=5, lo=5, hi=18)), params, use_tqdm=False)
    assert llm.stop_trace() == [str(path)]
    assert llm.stop_trace() == []  # nothing armed any more
    events = spans(path)
    assert_properly_nested(events)
    assert_step_structure(events, layers=True, numerics=True)
    copies = [e for e in events if e["name"] == "kv.copy"]
    assert copies and all(e["args"]["blocks"] >= 1 and e["args"]["us_per_block"] >= 0
                          for e in copies)
    assert_pool_clean(llm)


def test_swap_transfers_are_traced_with_their_blocks_and_change_no_token(engine_model_dir,
                                                                          tmp_path):
    # 22 blocks of 4 tokens for 24 requests of up to 82 tokens: victims are swapped out and in.
    prompts = mixed_prompts(24, seed=11)
    kw = dict(block_size=4, num_kv_blocks=22, max_num_batched_tokens=64, max_num_seqs=24,
              watermark=0.0, preemption_mode="swap", swap_space=0.01)
    plain = LLM(engine_model_dir, **kw).generate(tok(prompts), greedy(6), use_tqdm=False)
    path = tmp_path / "swap.json"
    llm = LLM(engine_model_dir, profile_trace=str(path), **kw)
    outs = llm.generate(tok(prompts), greedy(6), use_tqdm=False)
    llm.stop_trace()
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    events = spans(path)
    assert_properly_nested(events)
    assert_step_structure(events, layers=False)
    stats = llm.kv_cache_stats()
    moved = {name: sum(e["args"]["blocks"] for e in events if e["name"] == name)
             for name in ("kv.swap_out", "kv.swap_in")}
    assert moved["kv.swap_in"] > 0 and moved["kv.swap_out"] >= moved["kv.swap_in"]
    assert stats["num_swap_outs"] > 0
    assert all(e["args"]["us_per_block"] >= 0 for e in events if e["name"].startswith("kv."))
    assert_pool_clean(llm)


def test_persistent_tier_loads_and_stores_are_traced(engine_model_dir, tmp_path):
    prompts = mixed_prompts(3, seed=21, lo=40, hi=60)
    kw = dict(block_size=8, num_kv_blocks=256, persistence={"storage_path": str(tmp_path / "kv")})
    cold = LLM(engine_model_dir, profile_trace=str(tmp_path / "cold.json"), **kw)
    cold.generate(tok(prompts), greedy(4), use_tqdm=False)
    cold.close()  # writes the trace; queued stores reach the disk
    events = spans(tmp_path / "cold.json")
    stores = [e for e in events if e["name"] == "kv.store"]
    full_blocks = sum(len(p) // 8 for p in prompts)
    assert sum(e["args"]["blocks"] for e in stores) == full_blocks
    main_tid = next(e["tid"] for e in events if e["name"] == "step")
    assert all(e["tid"] != main_tid for e in stores)  # on the transfer thread
    assert_properly_nested(events)
    warm = LLM(engine_model_dir, profile_trace=str(tmp_path / "warm.json"), **kw)
    warm.generate(tok(prompts), greedy(4), use_tqdm=False)
    warm.close()
    events = spans(tmp_path / "warm.json")
    loads = [e for e in events if e["name"] == "kv.load"]
    assert loads and sum(e["args"]["blocks"] for e in loads) >= len(prompts)
    assert_step_structure(events, layers=False)  # the loads sit inside execute, before inputs


def test_llava_steps_are_traced_and_checked_per_layer(tmp_path):
    """An image prompt under a trace with layers and check_numerics: the encoder span sits
    before the forward, the decoder's layers are spanned and probed, the tokens do not move."""
    from mm_fixtures import IMAGE_TOKEN, random_image, text_prompt, write_tiny_llava

    path = write_tiny_llava(str(tmp_path / "llava"))
    prompts = [{"prompt_token_ids": text_prompt(4, 1) + [IMAGE_TOKEN] + text_prompt(3, 2),
                "multi_modal_data": {"image": [random_image(1)]}},
               {"prompt_token_ids": text_prompt(9, 3)}]
    plain = LLM(path, num_kv_blocks=128, block_size=4).generate(prompts, greedy(4),
                                                                use_tqdm=False)
    trace = tmp_path / "llava.json"
    llm = LLM(path, num_kv_blocks=128, block_size=4, profile_trace=str(trace),
              profile_layers=True, check_numerics="fail")
    outs = llm.generate(prompts, greedy(4), use_tqdm=False)
    llm.stop_trace()
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    events = spans(trace)
    assert_properly_nested(events)
    assert_step_structure(events, layers=True, numerics=True)
    assert sum(e["name"] == "encoder" for e in events) == 1
    assert llm.kv_cache_stats()["num_numeric_errors"] == 0
    assert_pool_clean(llm)


def test_trace_without_layers_and_file_valid_after_every_flush(engine_model_dir, tmp_path,
                                                                monkeypatch):
    monkeypatch.setattr(tracing, "FLUSH_EVENTS", 8)
    path = tmp_path / "t.json"
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64)
    llm.start_trace(str(path))
    engine = llm.engine
    for i, p in enumerate(mixed_prompts(2, seed=7, hi=12)):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, greedy(6))
    sizes = []
    while engine.has_unfinished_requests():
        engine.step()
        sizes.append(len(spans(path)))  # parses while the trace is still being recorded
    assert sizes[-1] > sizes[0] > 0
    llm.stop_trace()
    events = spans(path)
    assert len(events) > sizes[-1] - 1
    assert_properly_nested(events)
    assert_step_structure(events, layers=False)


def test_torch_profiler_window_captures_only_its_steps(engine_model_dir, tmp_path):
    path = tmp_path / "w.json"
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64, profile_trace=str(path),
              profile_torch_steps="1:3")
    llm.generate(tok(mixed_prompts(2, seed=9, hi=12)), greedy(5), use_tqdm=False)
    written = llm.stop_trace()
    torch_path = str(tmp_path / "w.torch.json")
    assert written == [str(path), torch_path]
    with open(torch_path) as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"pagedllm.step 1", "pagedllm.step 2"} <= names
    assert not {"pagedllm.step 0", "pagedllm.step 3"} & names
    assert any(n and n.startswith("aten::") for n in names)  # torch's own op events


def test_step_window_and_option_errors(engine_model_dir, tmp_path):
    assert parse_step_window("10:20", "w") == (10, 20)
    assert parse_step_window((0, 1), "w") == (0, 1)
    for bad in ("3:1", "2:2", "-1:4", "x", "1:2:3"):
        with pytest.raises(ValueError, match="w="):
            parse_step_window(bad, "w")
    with pytest.raises(ValueError, match="profile_torch_steps needs profile_trace"):
        TraceOptions(torch_steps="0:2")
    with pytest.raises(ValueError, match="profile_layers needs profile_trace"):
        TraceOptions(layers=True)
    assert TraceOptions("a/t.json", torch_steps=(1, 2)).torch_trace_path == "a/t.torch.json"
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64)
    with pytest.raises(ValueError, match="does not exist"):
        llm.start_trace(str(tmp_path / "no" / "such" / "t.json"))
    with pytest.raises(ValueError, match="device='cuda'"):
        llm.start_trace(str(tmp_path / "c.json"), cuda_steps="0:2")
    assert not (tmp_path / "c.json").exists()  # refused before anything was written
    with pytest.raises(ValueError, match="nothing to record"):
        llm.start_trace()
    assert llm.engine.tracer is None  # a refused start leaves nothing armed
    with pytest.raises(ValueError, match="profile_cuda_steps"):
        LLM(engine_model_dir, block_size=4, num_kv_blocks=64, profile_cuda_steps="5")


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_every_command_takes_the_profile_flags(command):
    from pagedllm.cli import build_parser
    from pagedllm.commands.common import start_trace

    args = build_parser().parse_args([command, "--profile-trace", "t.json", "--profile-layers",
                                      "--profile-torch-steps", "2:4", "--profile-cuda-steps",
                                      "5:6"] + (["x"] if command == "generate" else []))
    got = {}

    class Engine:
        def start_trace(self, **options):
            got.update(options)
    start_trace(Engine(), args)
    assert got == dict(path="t.json", layers=True, torch_steps="2:4", cuda_steps="5:6")
    alias = build_parser().parse_args([command, "--trace", "a.json"]
                                      + (["x"] if command == "generate" else []))
    assert alias.trace == "a.json"
    got.clear()
    start_trace(Engine(), build_parser().parse_args([command] + (["x"] if command == "generate"
                                                                 else [])))
    assert got == {}  # no flag: no trace


def test_cli_profile_flag_errors_name_the_flag(capsys, tmp_path):
    from pagedllm import cli

    code = cli.main(["generate", "--num-threads", "1", "--num-kv-blocks", "64", "--quiet",
                     "--profile-torch-steps", "2:1", "--profile-trace", str(tmp_path / "t.json"),
                     "Hello"])
    _, err = capsys.readouterr()
    assert code == 2 and "--profile-torch-steps='2:1'" in err and "START < END" in err, err


def test_generate_cli_trace_has_detokenize_spans(capsys, tmp_path):
    from pagedllm import cli

    path = tmp_path / "gen.json"
    code = cli.main(["generate", "--num-threads", "1", "--num-kv-blocks", "64", "--temperature",
                     "0", "--max-tokens", "3", "--quiet", "--trace", str(path), "Hello"])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert f"trace of the engine's steps written to {path}" in err
    events = spans(path)
    assert_properly_nested(events)
    detok = [e for e in events if e["name"] == "detokenize"]
    assert len(detok) == 3 and all(e["args"]["tokens"] == 1 for e in detok)
    for d in detok:  # inside its step's update span
        assert any(u["name"] == "update" and u["ts"] <= d["ts"] and
                   d["ts"] + d["dur"] <= u["ts"] + u["dur"] + 0.002 for u in events)


def test_bench_cli_writes_a_profile_trace(capsys, tmp_path):
    from pagedllm import cli

    path = tmp_path / "bench.json"
    code = cli.main(["bench", "--num-threads", "1", "--num-kv-blocks", "64", "--num-prompts", "2",
                     "--input-len", "8", "--output-len", "3", "--no-progress",
                     "--profile-trace", str(path), "--profile-layers"])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "trace of the engine's steps written to" in err
    events = spans(path)
    assert_properly_nested(events)
    assert {f"layer {i}" for i in range(4)} <= {e["name"] for e in events}  # the tiny bench model


def test_async_engine_writes_the_trace_on_its_thread(engine_model_dir, tmp_path):
    import asyncio

    from pagedllm.engine.async_engine import AsyncLLMEngine
    from pagedllm.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=engine_model_dir, block_size=4, num_kv_blocks=64))
    path = tmp_path / "serve.json"
    engine.start_trace(str(path))
    aeng = AsyncLLMEngine(engine)
    aeng.start()

    async def go():
        async for out in aeng.generate("a", {"prompt_token_ids": [5, 6, 7, 8]}, greedy(3)):
            last = out
        return last
    out = asyncio.run(go())
    assert len(out.outputs[0].token_ids) == 3
    aeng.shutdown()
    events = spans(path)
    assert_properly_nested(events)
    assert_step_structure(events, layers=False)


# --- NVTX and the CUDA profiler window, with the CUDA modules mocked ------------------------------
class FakeNvtx:
    """torch.cuda.nvtx's range_push / range_pop, recorded."""

    def __init__(self):
        self.calls, self.depth = [], 0

    def range_push(self, name):
        self.calls.append(("push", name))
        self.depth += 1
        return self.depth - 1

    def range_pop(self):
        self.calls.append(("pop", None))
        self.depth -= 1
        return self.depth


class FakeProfiler:
    def __init__(self, log):
        self.log = log

    def start(self):
        self.log.append("start")

    def stop(self):
        self.log.append("stop")


def test_nvtx_is_off_on_the_cpu(engine_model_dir, tmp_path):
    assert tracing.nvtx_module(False) is None
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64,
              profile_trace=str(tmp_path / "t.json"))
    assert llm.engine.tracer.recorder.nvtx is None
    assert llm.engine.executor.worker.model_runner.recorder is llm.engine.tracer.recorder
    llm.stop_trace()
    assert llm.engine.executor.worker.model_runner.recorder is tracing.NULL_RECORDER


def test_nvtx_ranges_mirror_the_spans_and_stay_balanced(engine_model_dir, tmp_path, monkeypatch):
    nvtx = FakeNvtx()
    monkeypatch.setattr(tracing, "nvtx_module", lambda on_cuda: nvtx)
    path = tmp_path / "n.json"
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64, profile_trace=str(path),
              profile_layers=True)
    llm.generate(tok(mixed_prompts(2, seed=3, hi=12)), greedy(3), use_tqdm=False)
    llm.stop_trace()
    pushed = [name for op, name in nvtx.calls if op == "push"]
    recorded = [e["name"] for e in spans(path)]
    assert sorted(pushed) == sorted(recorded)  # one range per span (no detokenize: no tokenizer)
    assert nvtx.depth == 0 and len(nvtx.calls) == 2 * len(pushed)
    # A layer that raises mid-forward: its requests fail, and no range is left open.
    model = llm.engine.executor.worker.model

    def boom(module, args, output):
        raise RuntimeError("injected")
    handle = model.layers[1].register_forward_hook(boom)
    llm.start_trace(str(tmp_path / "m.json"), layers=True)
    (out,) = llm.generate(tok([[5, 6, 7]]), greedy(2), use_tqdm=False)
    handle.remove()
    llm.stop_trace()
    assert out.outputs[0].finish_reason == "error" and "injected" in out.error
    assert nvtx.depth == 0
    assert_pool_clean(llm)


def test_cuda_profiler_window_starts_and_stops_around_its_steps(tmp_path, monkeypatch):
    log = []
    nvtx = FakeNvtx()
    monkeypatch.setattr(tracing, "nvtx_module", lambda on_cuda: nvtx if on_cuda else None)
    monkeypatch.setattr(tracing, "cuda_profiler_module", lambda: FakeProfiler(log))
    tracer = tracing.StepTracer(TraceOptions(cuda_steps="2:4"), on_cuda=True,
                                synchronize=lambda: log.append("sync"))
    for step in range(6):
        log.append(f"begin {step}")
        token = tracer.begin_step()
        with tracer.recorder.span("schedule"):
            pass
        tracer.end_step(token)
    tracer.close()
    assert log == ["begin 0", "begin 1", "begin 2", "sync", "start", "begin 3", "sync", "stop",
                   "begin 4", "begin 5"]
    assert [n for op, n in nvtx.calls if op == "push"] == ["step", "schedule"] * 6
    assert nvtx.depth == 0
    assert tracer.recorder.events == []  # no JSON asked for: NVTX only, nothing kept

    # A run that ends inside the window stops the profiler at close().
    log.clear()
    tracer = tracing.StepTracer(TraceOptions(cuda_steps="0:10"), on_cuda=True)
    tracer.end_step(tracer.begin_step())
    tracer.close()
    assert log == ["start", "stop"]
    assert profile_windows.CudaProfilerWindow  # the class the engine uses
