"""The Ray executor at tensor_parallel_size 2 on a local two-node Ray cluster (started once for
the module): one rank per node, the same tokens as the in-process engine and transformers, and
a killed or stopped actor named."""

from __future__ import annotations

import os
import signal

import pytest

from engine_fixtures import (assert_pool_clean, engine_model_dir, greedy, hf_greedy,  # noqa: F401
                             mixed_prompts, tok)
from pagedllm import LLM
from pagedllm.engine.executor import ExecutorDeadError
from tp_fixtures import signal_rank_mid_request, wait_gone, worker_pids

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of two nodes with one CPU each (ray.cluster_utils: two raylets on
    this host), so that the placement group must put one rank on each node."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    yield
    ray.shutdown()
    cluster.shutdown()


def test_ray_tp2_equals_tp1_and_transformers_with_forks_and_preemption(local_ray,
                                                                       engine_model_dir):
    prefix = mixed_prompts(1, seed=5, lo=20, hi=20)[0]
    prompts = [prefix + p for p in mixed_prompts(8, seed=12, hi=40)]
    reference = [hf_greedy(engine_model_dir, p, 8) for p in prompts]
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=40, max_num_batched_tokens=64,
              max_num_seqs=32, watermark=0.0, num_threads=1, tensor_parallel_size=2,
              distributed_executor_backend="ray")
    assert "x2 (tensor parallel, ray)" in llm.kv_cache_stats()["device"]
    from ray.util.placement_group import placement_group_table

    nodes = placement_group_table(llm.engine.executor._pg)["bundles_to_node_id"]
    assert len(set(nodes.values())) == 2  # one rank on each Ray node
    outs = llm.generate(tok(prompts), greedy(8, n=2))
    for out, ref in zip(outs, reference):
        assert [c.token_ids for c in out.outputs] == [ref, ref]
    stats = llm.kv_cache_stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hit_rate"] > 0, stats
    assert_pool_clean(llm)
    pids = list(llm.engine.executor.worker_pids)
    llm.engine.shutdown()
    assert wait_gone(pids) == []


def test_ray_killed_actor_fails_the_engine_naming_the_rank(local_ray, engine_model_dir):
    llm = LLM(engine_model_dir, num_kv_blocks=200, num_threads=1, tensor_parallel_size=2,
              distributed_executor_backend="ray", distributed_timeout_s=120)
    pids = worker_pids(llm)
    err = signal_rank_mid_request(llm, signal.SIGKILL, mixed_prompts(4, seed=1))
    assert isinstance(err, ExecutorDeadError), err
    assert "rank 1" in str(err) and "no answer within" not in str(err), str(err)
    assert wait_gone(pids) == []
    llm.engine.shutdown()


def test_ray_stopped_actor_times_out_naming_the_rank(local_ray, engine_model_dir):
    llm = LLM(engine_model_dir, num_kv_blocks=200, num_threads=1, tensor_parallel_size=2,
              distributed_executor_backend="ray", distributed_timeout_s=5)
    pids = worker_pids(llm)
    err = signal_rank_mid_request(llm, signal.SIGSTOP, mixed_prompts(4, seed=1))
    assert isinstance(err, ExecutorDeadError), err
    message = str(err)
    assert "no answer within 5 s (distributed_timeout_s)" in message, message
    assert "rank(s) [1] stopped first" in message, message
    assert wait_gone(pids) == []  # ray.kill ends the stopped actor too
    llm.engine.shutdown()
