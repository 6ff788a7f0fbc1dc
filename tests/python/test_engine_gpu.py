"""The engine on a GPU (skipped cleanly without one): greedy parity with transformers, swap
preemption under pressure, and the swap copies on their own stream in a profiler trace.

The model has head_dim 64 (the CUDA kernels are compiled for 64, 80, 96, 128, 256). Set
PAGEDLLM_TRACE_DIR to keep the chrome trace of the overlap test (run_on_device.sh does).
"""

from __future__ import annotations

import os

import pytest

from engine_fixtures import greedy as greedy_params
from engine_fixtures import mixed_prompts, tok
from gpu_fixtures import GPU_MARKS, write_gpu_model
from pagedllm import LLM

pytestmark = GPU_MARKS

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory) -> str:
    return write_gpu_model(tmp_path_factory, "gpu_model", seed=99)


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts(16, seed=4)


@pytest.fixture(scope="module")
def reference(gpu_model_dir, prompts):
    from engine_fixtures import hf_greedy

    return [hf_greedy(gpu_model_dir, p, MAX_TOKENS) for p in prompts]



def greedy():
    return greedy_params(MAX_TOKENS)



def test_cuda_engine_greedy_matches_transformers(gpu_model_dir, prompts, reference):
    llm = LLM(gpu_model_dir, device="cuda", dtype="float32", block_size=16, num_kv_blocks=256)
    assert llm.kv_cache_stats()["device"].startswith("cuda")
    outs = llm.generate(tok(prompts), greedy(), use_tqdm=False)
    same = sum(o.outputs[0].token_ids == r for o, r in zip(outs, reference))
    # fp32 on the GPU: TF32 is off in torch by default, so tokens match but for rare near-ties.
    assert same >= len(prompts) - 1, same
    assert llm.kv_cache_stats()["used_blocks"] == 0


def test_cuda_engine_bf16_runs(gpu_model_dir, prompts, reference):
    llm = LLM(gpu_model_dir, device="cuda", block_size=16, num_kv_blocks=256)
    assert llm.kv_cache_stats()["device"].endswith("bfloat16")
    outs = llm.generate(tok(prompts), greedy(), use_tqdm=False)
    first = sum(o.outputs[0].token_ids[0] == r[0] for o, r in zip(outs, reference))
    assert first >= len(prompts) // 2


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_cuda_preemption_under_pressure_matches_alone(gpu_model_dir, prompts, mode):
    tight = LLM(gpu_model_dir, device="cuda", dtype="float32", block_size=4, num_kv_blocks=24,
                max_num_batched_tokens=64, max_num_seqs=16, watermark=0.0,
                preemption_mode=mode, swap_space=0.05)
    outs = tight.generate(tok(prompts), greedy(), use_tqdm=False)
    s = tight.kv_cache_stats()
    assert s["num_preemptions"] > 0, s
    if mode == "swap":
        assert s["num_swap_outs"] > 0 and s["host_free_blocks"] == s["host_blocks"], s
    roomy = LLM(gpu_model_dir, device="cuda", dtype="float32", block_size=4, num_kv_blocks=512)
    for p, o in zip(prompts, outs):
        (a,) = roomy.generate(tok([p]), greedy(), use_tqdm=False)
        assert a.outputs[0].token_ids == o.outputs[0].token_ids
    assert s["used_blocks"] == 0


def test_swap_copies_run_on_their_own_stream(gpu_model_dir, prompts, tmp_path):
    from torch.profiler import ProfilerActivity, profile

    llm = LLM(gpu_model_dir, device="cuda", dtype="float32", block_size=4, num_kv_blocks=24,
              max_num_batched_tokens=64, max_num_seqs=16, watermark=0.0,
              preemption_mode="swap", swap_space=0.05)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(tok(prompts), greedy(), use_tqdm=False)
    trace_dir = os.environ.get("PAGEDLLM_TRACE_DIR", str(tmp_path))
    os.makedirs(trace_dir, exist_ok=True)
    prof.export_chrome_trace(os.path.join(trace_dir, "swap_overlap_trace.json"))
    assert llm.kv_cache_stats()["num_swap_outs"] > 0
    streams = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        kind = "copy" if "memcpy" in e.name.lower() or "swap" in e.name.lower() else "compute"
        streams.setdefault(kind, set()).add(getattr(e, "stream", None) or e.device_resource_id)
    assert "copy" in streams and "compute" in streams, streams
    assert streams["copy"] - streams["compute"], (
        f"block swaps ran only on compute streams: {streams}")
