"""Tensor parallelism without processes: the shards a rank loads reassemble the whole weights,
the reply rules of the distributed executors, and the options (YAML, CLI)."""

from __future__ import annotations

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.engine.executor import ExecutorDeadError, StepRefusedError
from pagedllm.engine.tp_driver import laggards, merge_replies, startup_error
from pagedllm.engine.tp_worker import encode_output
from pagedllm.engine.model_runner import ModelOutput
from pagedllm.model import CheckpointError, load_model
from pagedllm.model.parallel_loader import load_model_shard
from pagedllm.model.tensor_parallel import TPShard
from tp_fixtures import write_tp_model


class _NoComm:
    """Loading calls no collective; a forward would fail loudly here."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, t):
        raise AssertionError("no collective expected")

    gather_last_dim = all_reduce


def _shards(path, tp):
    return [load_model_shard(path, TPShard(r, tp), _NoComm(r, tp))[0] for r in range(tp)]


@pytest.mark.parametrize("kind, tp", [("mha", 2), ("mha", 4), ("gqa", 2), ("mqa", 2),
                                      ("mqa", 4), ("tied_bias", 2)])
def test_shards_reassemble_the_whole_model(tmp_path, kind, tp):
    path = write_tp_model(tmp_path, kind)
    full, config = load_model(path)
    shards = _shards(path, tp)
    d, h, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    f = config.intermediate_size
    q_local = h // tp * d
    for i, layer in enumerate(full.layers):
        qkv = layer.self_attn.qkv_proj.weight        # [q + 2 kv, hidden]
        q, k, v = qkv.split([h * d, kv * d, kv * d])
        parts = [s.layers[i].self_attn.qkv_proj.weight for s in shards]
        torch.testing.assert_close(torch.cat([p[:q_local] for p in parts]), q, rtol=0, atol=0)
        ks = [p[q_local:q_local + max(1, kv // tp) * d] for p in parts]
        vs = [p[q_local + max(1, kv // tp) * d:] for p in parts]
        if kv >= tp:  # split: the ranks' KV heads in order
            torch.testing.assert_close(torch.cat(ks), k, rtol=0, atol=0)
            torch.testing.assert_close(torch.cat(vs), v, rtol=0, atol=0)
        else:  # replicated: rank r holds the KV head its query heads read
            for r in range(tp):
                head = (r * (h // tp)) // (h // kv)
                torch.testing.assert_close(ks[r], k[head * d:(head + 1) * d], rtol=0, atol=0)
                torch.testing.assert_close(vs[r], v[head * d:(head + 1) * d], rtol=0, atol=0)
        o = torch.cat([s.layers[i].self_attn.o_proj.weight for s in shards], dim=1)
        torch.testing.assert_close(o, layer.self_attn.o_proj.weight, rtol=0, atol=0)
        gate, up = layer.mlp.gate_up_proj.weight.split(f)
        gu = [s.layers[i].mlp.gate_up_proj.weight for s in shards]
        torch.testing.assert_close(torch.cat([g[:f // tp] for g in gu]), gate, rtol=0, atol=0)
        torch.testing.assert_close(torch.cat([g[f // tp:] for g in gu]), up, rtol=0, atol=0)
        down = torch.cat([s.layers[i].mlp.down_proj.weight for s in shards], dim=1)
        torch.testing.assert_close(down, layer.mlp.down_proj.weight, rtol=0, atol=0)
        for s in shards:  # whole on every rank: norms and row-parallel biases
            torch.testing.assert_close(s.layers[i].input_layernorm.weight,
                                       layer.input_layernorm.weight, rtol=0, atol=0)
            if config.attention_bias:
                torch.testing.assert_close(s.layers[i].self_attn.o_proj.bias,
                                           layer.self_attn.o_proj.bias, rtol=0, atol=0)
    embed = torch.cat([s.embed_tokens.weight for s in shards])
    vocab = config.vocab_size
    torch.testing.assert_close(embed[:vocab], full.embed_tokens.weight, rtol=0, atol=0)
    assert not embed[vocab:].any()  # the padded rows of the last shard are zero
    if not config.tie_word_embeddings:
        head = torch.cat([s.lm_head.weight for s in shards])
        torch.testing.assert_close(head[:vocab], full.lm_head.weight, rtol=0, atol=0)


def test_shard_loading_refuses_a_split_that_does_not_divide(tmp_path):
    path = write_tp_model(tmp_path, "gqa")
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide "
                                         "num_attention_heads=4"):
        load_model_shard(path, TPShard(0, 3), _NoComm(0, 3))


def _ok(logits=None):
    return "ok", encode_output(ModelOutput(logits, {}))


def test_replies_all_ok_give_rank0s_logits():
    logits = torch.arange(6, dtype=torch.float32).view(2, 3)
    out = merge_replies({0: _ok(logits), 1: ("ok", None)})
    torch.testing.assert_close(out.logits, logits)


def test_replies_the_same_error_everywhere_fail_only_the_step():
    with pytest.raises(StepRefusedError, match="^ValueError: bad slots$") as info:
        merge_replies({0: ("error", "ValueError: bad slots"), 1: ("error", "ValueError: bad slots")})
    assert not isinstance(info.value, ExecutorDeadError)


def test_a_refused_step_names_the_ranks_error_once(tmp_path, monkeypatch):
    # The ranks' "Type: message" reached the requests as "RuntimeError: ValueError: ...".
    from pagedllm import LLM, SamplingParams

    path = write_tp_model(tmp_path / "m", "gqa")
    llm = LLM(str(path), num_kv_blocks=32, block_size=4, device="cpu", num_threads=1)
    run = llm.engine.executor.execute_model
    calls = []

    def refuse_once(out):
        calls.append(1)
        if len(calls) == 1:
            raise StepRefusedError("ValueError: injected on every rank")
        return run(out)

    monkeypatch.setattr(llm.engine.executor, "execute_model", refuse_once)
    out = llm.generate([{"prompt_token_ids": [1, 5, 9]}], SamplingParams(max_tokens=2),
                       use_tqdm=False)[0]
    assert out.error == "the model step failed: ValueError: injected on every rank"


def test_replies_one_rank_failing_kill_the_executor():
    with pytest.raises(ExecutorDeadError, match="rank 1: RuntimeError: boom"):
        merge_replies({0: _ok(), 1: ("error", "RuntimeError: boom")})


def test_startup_errors_every_rank_shares_are_reraised_as_themselves():
    assert startup_error({0: ("ok", 1), 1: ("ok", 2)}) is None
    same = {r: ("error", "CheckpointError: /m: missing tensor 'x'") for r in (0, 1)}
    err = startup_error(same)
    assert type(err) is CheckpointError and str(err) == "/m: missing tensor 'x'"
    err = startup_error({0: ("ok", 1), 1: ("error", "ValueError: bad")})
    assert isinstance(err, ExecutorDeadError) and "rank 1: ValueError: bad" in str(err)


def test_laggards_are_the_ranks_behind_or_every_pending_one():
    assert laggards([14, 12, 14], [0, 1, 2]) == [1]
    assert laggards([7, 7], [1]) == [1]
    assert laggards([3, 3], []) == []


def test_parallel_options_from_yaml_and_cli(tmp_path):
    cfg = EngineConfig.from_dict({"parallel": {"tensor_parallel_size": 2,
                                               "distributed_executor_backend": "ray",
                                               "timeout_s": 30}})
    assert (cfg.tensor_parallel_size, cfg.distributed_executor_backend,
            cfg.distributed_timeout_s) == (2, "ray", 30)
    with pytest.raises(ValueError, match="unknown key 'parallel.pipeline_parallel_size'"):
        EngineConfig.from_dict({"parallel": {"pipeline_parallel_size": 2}})
    from pagedllm.cli import build_parser
    from pagedllm.commands.common import engine_config

    args = build_parser().parse_args(["serve", "-tp", "4", "--distributed-executor-backend",
                                      "mp", "--distributed-timeout", "9"])
    cfg = engine_config(args)
    assert (cfg.tensor_parallel_size, cfg.distributed_executor_backend,
            cfg.distributed_timeout_s) == (4, "mp", 9.0)


class _SumComm:
    """One rank's collectives as identities (the rank's own rows are the whole sum)."""

    rank, world_size = 0, 1

    def all_reduce(self, t):
        return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_shard_packed_as_a_tied_head_looks_up_and_multiplies_the_same(monkeypatch, dtype):
    from pagedllm.model import packed_linear
    from pagedllm.model.parallel_llama import VocabParallelEmbedding

    if packed_linear.tied_backend(dtype) is None:
        pytest.skip("no vector tiles for the packed tied head on this CPU")
    monkeypatch.setattr(packed_linear, "MIN_PACKED_ELEMENTS", 0)
    g = torch.Generator().manual_seed(0)
    emb = VocabParallelEmbedding(40, 77, 48, 24, dtype, _SumComm())  # rows [40, 77), padded 48
    emb.weight.data.copy_(torch.randn(48, 24, generator=g).to(dtype))
    weight = emb.weight.detach().clone()
    ids = torch.tensor([3, 40, 41, 76, 77, 100, 60])  # some outside the shard: zero rows
    hidden = torch.randn(5, 24, generator=g).to(dtype)
    want_rows, want_logits = emb(ids), emb.logits(hidden)
    assert emb.pack_tied() and emb.weight is None
    assert torch.equal(emb(ids), want_rows)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5  # summation order only (bf16: one rounding)
    torch.testing.assert_close(emb.logits(hidden).float(), want_logits.float(), rtol=tol,
                               atol=1e-4)
    assert torch.equal(emb.lookup(torch.tensor([7])), weight[7:8])
