"""Tensor parallelism on GPUs over nccl: TP=2 needs two GPUs (skipped with fewer); the
distributed path at size 1 (a spawned rank, nccl, the sharded loader and the logits gather on
the device) runs on one."""

from __future__ import annotations

import pytest
import torch

from engine_fixtures import greedy, hf_greedy, mixed_prompts, tok
from pagedllm import LLM
from tp_fixtures import wait_gone, worker_pids, write_tp_model

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize("tp", [1, 2])
def test_cuda_tp_greedy_equals_transformers(tmp_path, tp):
    if _gpus() < tp:
        pytest.skip(f"needs {tp} GPUs, {_gpus()} visible")
    # head_dim 64: the CUDA kernels' smallest (the CPU tests' models have 16)
    path = write_tp_model(tmp_path, "gqa", hidden_size=256, intermediate_size=512)
    prompts = mixed_prompts(4, seed=3, hi=40, vocab=500)
    llm = LLM(path, device="cuda", dtype="float32", num_kv_blocks=64, tensor_parallel_size=tp,
              distributed_executor_backend="mp")
    assert "cuda" in llm.kv_cache_stats()["device"]
    pids = worker_pids(llm)
    outs = llm.generate(tok(prompts), greedy(8))
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(path, p, 8) for p in prompts]
    llm.engine.shutdown()
    assert wait_gone(pids) == []
