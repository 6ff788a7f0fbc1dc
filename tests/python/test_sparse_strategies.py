"""Block selection of every strategy against a plain Python reference (sets and loops), the
rules every strategy keeps (block 0, the current block, min_context), the plan's CSR layout,
and the sparse_attention config's errors."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagedllm.sparse import SparseAttentionConfig, get_strategy, parse_sparse_attention
from pagedllm.sparse.plan import plan_step, select_blocks


def ref_fixed(n, cfg):
    return {b for b in range(n) if b < cfg.sink_blocks or b >= n - cfg.local_blocks}


def ref_dilated(n, cfg):
    return ref_fixed(n, cfg) | {b for b in range(n) if b % cfg.stride == 0}


def ref_random(n, cfg):
    fixed = ref_fixed(n, cfg)
    middle = [b for b in range(n) if b not in fixed]
    drawn = set(np.random.default_rng([cfg.seed, n]).choice(
        np.array(middle, dtype=np.int64), size=round(cfg.density * len(middle)),
        replace=False).tolist()) if middle else set()
    return fixed | drawn


REFERENCES = {"fixed_pattern": ref_fixed, "dilated": ref_dilated, "random": ref_random,
              "streaming": ref_fixed, "quest": ref_fixed}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_selection_matches_reference(name):
    rng = random.Random(name)
    for _ in range(200):
        cfg = SparseAttentionConfig(strategy=name, sink_blocks=rng.randint(1, 4),
                                    local_blocks=rng.randint(1, 6), stride=rng.randint(1, 9),
                                    density=rng.choice([0.05, 0.125, 0.5, 1.0]),
                                    seed=rng.randint(0, 99))
        n = rng.randint(1, 300)
        got = get_strategy(name).select(n, cfg)
        assert got.dtype == np.int32 and list(got) == sorted(set(got.tolist()))
        assert set(got.tolist()) == REFERENCES[name](n, cfg)


def test_random_density_and_seed():
    cfg = SparseAttentionConfig(strategy="random", density=0.25, seed=3)
    a = get_strategy("random").select(1000, cfg)
    assert np.array_equal(a, get_strategy("random").select(1000, cfg))  # seeded
    other = get_strategy("random").select(1000, SparseAttentionConfig(strategy="random",
                                                                      density=0.25, seed=4))
    assert not np.array_equal(a, other)
    middle = 1000 - 1 - 4
    assert len(a) == 5 + round(0.25 * middle)


@pytest.mark.parametrize("name", ["fixed_pattern", "dilated", "random", "streaming"])
def test_first_and_current_block_always_read(name):
    for n_tokens in [1, 15, 16, 17, 1000, 4097]:
        cfg = SparseAttentionConfig(strategy=name, sink_blocks=1, local_blocks=1, stride=50,
                                    density=0.01)
        blocks, budget = select_blocks(cfg, n_tokens, 16)
        last = (n_tokens - 1) // 16
        assert budget == 0 and blocks[0] == 0 and blocks[-1] == last


def test_min_context_and_dense_read_every_block():
    cfg = SparseAttentionConfig(strategy="fixed_pattern", min_context=1000)
    assert list(select_blocks(cfg, 999, 16)[0]) == list(range(63))
    assert len(select_blocks(cfg, 1000, 16)[0]) == 5
    assert list(select_blocks(SparseAttentionConfig(), 999, 16)[0]) == list(range(63))
    assert list(select_blocks(None, 40, 16)[0]) == [0, 1, 2]


def test_quest_budget():
    cfg = SparseAttentionConfig(strategy="quest", sink_blocks=1, local_blocks=2,
                                token_budget=160)
    blocks, budget = select_blocks(cfg, 1600, 16)  # 100 blocks, budget 10
    assert list(blocks) == [0, 98, 99] and budget == 10
    blocks, budget = select_blocks(cfg, 150, 16)  # 10 blocks: the budget covers them all
    assert list(blocks) == list(range(10)) and budget == 0


def test_plan_layout_and_counts():
    cfgs = [SparseAttentionConfig(strategy="fixed_pattern", local_blocks=2), None,
            SparseAttentionConfig(strategy="quest", local_blocks=1, token_budget=64)]
    lens = np.array([160, 40, 320], dtype=np.int32)  # 10, 3 and 20 blocks of 16
    plan = plan_step(cfgs, lens, 16)
    lists = [plan.indices[plan.indptr[i]:plan.indptr[i + 1]].tolist() for i in range(3)]
    assert lists == [[0, 8, 9], [0, 1, 2], [0, 19]]
    assert plan.budget.tolist() == [0, 0, 4] and plan.query_aware
    assert plan.blocks_read == 3 + 3 + 4 and plan.blocks_held == 33
    assert plan_step([None, None], lens[:2], 16) is None
    assert plan_step([None], lens[:1], 16, always=True).indices.tolist() == list(range(10))


@pytest.mark.parametrize("value,match", [
    ({"strategy": "nope"}, r"strategy: expected one of \['dense', 'dilated'"),
    ({"strategy": "dilated", "stride": 0}, r"stride: expected an integer >= 1, got 0"),
    ({"strategy": "random", "density": 0}, r"density: expected a number in \(0, 1\]"),
    ({"strategy": "random", "density": 1.5}, r"density"),
    ({"strategy": "quest", "token_budget": -1}, r"token_budget: expected an integer >= 1"),
    ({"strategy": "fixed_pattern", "sink_blocks": True}, r"sink_blocks"),
    ({"strategy": "fixed_pattern", "window": 3}, r"unknown key\(s\) \['window'\]"),
    ({"sink_blocks": 2}, r"'strategy' is required"),
    ("quest", r"expected a mapping"),
])
def test_config_errors(value, match):
    with pytest.raises(ValueError, match=match):
        parse_sparse_attention(value, "X.sparse_attention")


def test_quest_budget_below_forced_blocks_is_an_error():
    cfg = parse_sparse_attention({"strategy": "quest", "token_budget": 16, "local_blocks": 4})
    with pytest.raises(ValueError, match=r"token_budget = 16 is below the 1 sink \+ 4 local"):
        cfg.check_block_size(16)
