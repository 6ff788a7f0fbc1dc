"""Diagnostics on a GPU (skipped cleanly without one): the step trace with NVTX ranges and the
cudaProfilerStart/Stop window around the chosen steps (the real torch.cuda modules, spied on),
and the per-layer numeric probe on the device.

The model has head_dim 64 (the CUDA kernels are compiled for 64, 80, 96, 128, 256).
"""

from __future__ import annotations

import pytest

from engine_fixtures import assert_pool_clean, greedy, mixed_prompts, tok
from gpu_fixtures import GPU_MARKS, write_gpu_model
from pagedllm import LLM
from trace_fixtures import assert_properly_nested, assert_step_structure, spans

pytestmark = GPU_MARKS

MARK = 511


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory) -> str:
    return write_gpu_model(tmp_path_factory, "gpu_diag_model", seed=7)


def test_trace_nvtx_and_cuda_profiler_window_on_the_gpu(gpu_model_dir, tmp_path, monkeypatch):
    import torch.cuda.nvtx as nvtx
    import torch.cuda.profiler as profiler

    calls = []
    real_push, real_pop = nvtx.range_push, nvtx.range_pop
    real_start, real_stop = profiler.start, profiler.stop
    monkeypatch.setattr(nvtx, "range_push", lambda name: (calls.append(name), real_push(name))[1])
    monkeypatch.setattr(nvtx, "range_pop", lambda: (calls.append(None), real_pop())[1])
    monkeypatch.setattr(profiler, "start", lambda: (calls.append("START"), real_start())[1])
    monkeypatch.setattr(profiler, "stop", lambda: (calls.append("STOP"), real_stop())[1])
    path = tmp_path / "gpu.json"
    llm = LLM(gpu_model_dir, device="cuda", block_size=16, num_kv_blocks=64,
              profile_trace=str(path), profile_layers=True, profile_cuda_steps="1:3",
              check_numerics="fail")
    outs = llm.generate(tok(mixed_prompts(4, seed=1, hi=40)), greedy(5), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [5] * 4
    llm.stop_trace()
    events = spans(path)
    assert_properly_nested(events)
    assert_step_structure(events, layers=True, numerics=True, num_layers=2)
    pushes = [c for c in calls if c not in (None, "START", "STOP")]
    assert sorted(pushes) == sorted(e["name"] for e in events)
    assert calls.count(None) == len(pushes)
    # The window: START right before step 1's range, STOP right after step 2's ranges close.
    start, stop = calls.index("START"), calls.index("STOP")
    assert calls[start + 1] == "step" and calls.count("START") == calls.count("STOP") == 1
    assert calls[:start].count("step") == 1 and calls[start:stop].count("step") == 2
    assert_pool_clean(llm)


def test_per_layer_probe_on_the_gpu_fails_one_request(gpu_model_dir):
    prompts = mixed_prompts(3, seed=2, lo=10, hi=30)
    prompts[1][12] = MARK
    # float32: the failed request leaves smaller batches, whose matmuls may round differently
    ref = LLM(gpu_model_dir, device="cuda", dtype="float32", block_size=16, num_kv_blocks=64)
    expected = [o.outputs[0].token_ids for o in ref.generate(tok(prompts), greedy(5),
                                                             use_tqdm=False)]
    llm = LLM(gpu_model_dir, device="cuda", dtype="float32", block_size=16, num_kv_blocks=64,
              check_numerics="fail")
    model = llm.engine.executor.worker.model
    seen = {}
    hooks = [model.register_forward_pre_hook(lambda m, args: seen.update(ids=args[0])),
             model.layers[0].register_forward_hook(
                 lambda m, args, out: out.masked_fill_((seen["ids"] == MARK)[:, None],
                                                       float("nan")))]
    outs = llm.generate(tok(prompts), greedy(5), use_tqdm=False)
    for h in hooks:
        h.remove()
    assert outs[1].outputs[0].finish_reason == "error"
    assert "layer 0 (model.layers.0) at position 12" in outs[1].error, outs[1].error
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == [expected[0],
                                                                            expected[2]]
    assert_pool_clean(llm)
