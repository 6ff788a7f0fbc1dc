"""Block-sparse attention under tensor parallelism (2 spawned ranks over gloo): each rank
attends over its KV heads' share of the planned blocks (quest picks per local KV head from its
own key bounds; streaming drops blocks on the driver's tables), and greedy tokens equal the
in-process engine's with the same config."""

from __future__ import annotations

import pytest

from engine_fixtures import assert_pool_clean, engine_model_dir, greedy, mixed_prompts, tok  # noqa: F401
from pagedllm import LLM
from tp_fixtures import wait_gone, worker_pids

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("cfg", [{"strategy": "quest", "token_budget": 16, "local_blocks": 2},
                                 {"strategy": "streaming", "local_blocks": 2}])
def test_tp2_sparse_equals_tp1(engine_model_dir, cfg):  # noqa: F811
    prompts = mixed_prompts(3, seed=5, lo=20, hi=50)
    kw = dict(block_size=4, num_kv_blocks=200, num_threads=1, sparse_attention=cfg)
    one = LLM(engine_model_dir, **kw)
    tp1 = [o.outputs[0].token_ids for o in one.generate(tok(prompts), greedy(24))]
    llm = LLM(engine_model_dir, tensor_parallel_size=2, **kw)
    pids = worker_pids(llm)
    tp2 = [o.outputs[0].token_ids for o in llm.generate(tok(prompts), greedy(24))]
    assert tp2 == tp1
    stats = llm.kv_cache_stats()
    assert stats["sparse_blocks_held_total"] > 0
    assert_pool_clean(llm)
    llm.engine.shutdown()
    assert wait_gone(pids) == []
