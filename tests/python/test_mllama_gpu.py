"""Mllama on a CUDA device: the engine's greedy tokens (self and cross pools on the GPU, the
CUDA paged_cross_attention) equal transformers' on the CPU, batched with text-only requests,
under preemption and with n > 1; both pools are clean afterwards."""

from __future__ import annotations

import pytest

from gpu_fixtures import GPU_MARKS
from mllama_fixtures import assert_pools_clean, gpu_test_config, hf_greedy, write_tiny_mllama
from pagedllm import LLM
from test_mllama_engine import as_prompts, cases, greedy

pytestmark = GPU_MARKS


@pytest.fixture(scope="module")
def mllama_dir(tmp_path_factory) -> str:
    return write_tiny_mllama(str(tmp_path_factory.mktemp("mllama_gpu")), gpu_test_config())


@pytest.mark.parametrize("num_kv_blocks", [128, 14])  # 14: preemption by recompute
def test_cuda_greedy_matches_transformers(mllama_dir, num_kv_blocks):
    cs = cases()
    llm = LLM(mllama_dir, device="cuda", dtype="float32", block_size=4,
              num_kv_blocks=num_kv_blocks, num_cross_kv_blocks=64, max_num_seqs=4,
              max_num_batched_tokens=8 if num_kv_blocks == 14 else None, watermark=0.0)
    outs = llm.generate(as_prompts(cs) + as_prompts(cs[3:4]), greedy(max_tokens=8, n=1),
                        use_tqdm=False)
    for (p, ims), out in zip(cs + cs[3:4], outs):
        assert out.outputs[0].token_ids == hf_greedy(mllama_dir, p, ims, 8)[0], p
    (fork,) = llm.generate(as_prompts(cs[2:3]), greedy(max_tokens=8, n=3), use_tqdm=False)
    assert [c.token_ids for c in fork.outputs] == [hf_greedy(mllama_dir, *cs[2], 8)[0]] * 3
    assert_pools_clean(llm)
