"""The persistent KV tier end to end: outputs identical with a cold store, a warm store and after
a restart; corrupt or foreign records are misses; a store that fails leaves the engine serving."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from engine_fixtures import ENGINE_MODEL, engine_model_dir, mixed_prompts, tok  # noqa: F401
from engine_fixtures import greedy as greedy_params
from pagedllm import LLM
from pagedllm.config import EngineConfig

MAX_TOKENS = 8




def greedy():
    return greedy_params(MAX_TOKENS)


@pytest.fixture(scope="module")
def prompts():
    # Long prompts sharing nothing, plus two that share a 48-token prefix.
    ps = mixed_prompts(6, seed=21, lo=40, hi=90)
    return ps + [ps[0][:48] + [7, 8, 9], ps[0][:48] + [10, 11]]


def engine(model_dir, path, **kw):
    kw.setdefault("kv_cache_dtype", "auto")
    return LLM(model_dir, block_size=8, num_kv_blocks=256, seed=0,
               persistence={"storage_path": str(path), **kw.pop("persistence", {})}, **kw)


def run(llm, prompts):
    outs = llm.generate(tok(prompts), greedy(), use_tqdm=False)
    llm.engine.tier.flush()  # the writes are asynchronous: let them land before looking
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("kv_dtype", ["auto", "fp16", "bf16", "fp8"])
def test_cold_warm_and_restart_match_no_persistence(engine_model_dir, prompts, tmp_path,
                                                    kv_dtype):
    plain = LLM(engine_model_dir, block_size=8, num_kv_blocks=256, kv_cache_dtype=kv_dtype,
                enable_prefix_caching=False)
    ref = [o.outputs[0].token_ids for o in plain.generate(tok(prompts), greedy(),
                                                             use_tqdm=False)]
    store = tmp_path / "kv"
    cold = engine(engine_model_dir, store, kv_cache_dtype=kv_dtype)
    assert run(cold, prompts) == ref
    s = cold.kv_cache_stats()
    assert s["disk_records"] > 0 and s["disk_bytes_written"] > 0, s
    # Warm: the same engine again (memory prefix cache first, then disk).
    assert run(cold, prompts) == ref
    cold.engine.shutdown()
    # Restart: a new engine on the same store, nothing in memory.
    warm = engine(engine_model_dir, store, kv_cache_dtype=kv_dtype)
    assert run(warm, prompts) == ref
    s = warm.kv_cache_stats()
    assert s["disk_hit_tokens"] >= 8 * len(prompts), s
    assert s["used_blocks"] == 0
    warm.engine.shutdown()


def test_restart_with_another_model_or_dtype_never_hits(engine_model_dir, prompts, tmp_path):
    from pagedllm.model import write_random_checkpoint

    store = tmp_path / "kv"
    first = engine(engine_model_dir, store)
    run(first, prompts)
    first.engine.shutdown()
    other_dir = tmp_path / "other"
    write_random_checkpoint(other_dir, preset=ENGINE_MODEL, seed=99, initializer_range=0.1)
    other = engine(str(other_dir), store)
    plain = LLM(str(other_dir), block_size=8, num_kv_blocks=256, enable_prefix_caching=False)
    ref = [o.outputs[0].token_ids for o in plain.generate(tok(prompts), greedy(),
                                                             use_tqdm=False)]
    assert run(other, prompts) == ref
    assert other.kv_cache_stats()["disk_hit_tokens"] == 0
    other.engine.shutdown()
    # The other model's records live beside the first one's: neither erased the other.
    back = engine(engine_model_dir, store)
    run(back, prompts)
    assert back.kv_cache_stats()["disk_hit_tokens"] > 0
    back.engine.shutdown()
    fp16 = engine(engine_model_dir, store, kv_cache_dtype="fp16")
    run(fp16, prompts)
    assert fp16.kv_cache_stats()["disk_hit_tokens"] == 0
    fp16.engine.shutdown()


def test_corrupt_records_are_misses_and_outputs_stay_right(engine_model_dir, prompts,
                                                            tmp_path):
    store = tmp_path / "kv"
    first = engine(engine_model_dir, store)
    ref = run(first, prompts)
    first.engine.shutdown()
    flipped = 0
    for root, _, files in os.walk(store):
        for name in files:
            path = os.path.join(root, name)
            if name == "LOCK" or os.path.getsize(path) < 64:
                continue
            with open(path, "r+b") as f:  # flip one payload byte near the end
                f.seek(-5, os.SEEK_END)
                b = f.read(1)
                f.seek(-5, os.SEEK_END)
                f.write(bytes([b[0] ^ 0xFF]))
            flipped += 1
    assert flipped > 0
    again = engine(engine_model_dir, store)
    assert run(again, prompts) == ref
    s = again.kv_cache_stats()
    assert s["disk_hit_tokens"] == 0 and s["disk_corrupt_dropped"] > 0, s
    again.engine.shutdown()


def test_a_store_removed_while_running_is_a_warning_not_an_outage(engine_model_dir, prompts,
                                                                   tmp_path, caplog):
    store = tmp_path / "kv"
    llm = engine(engine_model_dir, store)
    shutil.rmtree(store)
    with caplog.at_level(logging.WARNING, logger="pagedllm"):
        ref = run(llm, prompts)
    plain = LLM(engine_model_dir, block_size=8, num_kv_blocks=256, enable_prefix_caching=False)
    assert ref == [o.outputs[0].token_ids for o in plain.generate(tok(prompts), greedy(),
                                                                     use_tqdm=False)]
    s = llm.kv_cache_stats()
    assert s["disk_failed_writes"] > 0, s
    assert sum("persistent KV store" in r.message for r in caplog.records) == 1
    llm.engine.shutdown()


def test_two_engines_on_one_store_are_refused_clearly(engine_model_dir, tmp_path):
    store = tmp_path / "kv"
    first = engine(engine_model_dir, store)
    with pytest.raises(ValueError, match="persistence.storage_path .* cannot open") as e:
        engine(engine_model_dir, store)
    assert "call its close() first" in str(e.value)
    first.engine.shutdown()


def test_an_engine_dropped_without_close_lets_go_of_the_store(engine_model_dir, prompts,
                                                              tmp_path):
    """A notebook that rebinds `llm = LLM(...)` drops the old engine without close(): once
    collected it must release the directory's lock, its queued writes on disk (the tier's
    threads and atexit hook held it alive, and the lock, until the process ended)."""
    import gc
    import weakref

    store = tmp_path / "kv"
    first = engine(engine_model_dir, store)
    ref = run(first, prompts)
    tier = weakref.ref(first.engine.tier)
    del first
    gc.collect()
    assert tier() is None
    second = engine(engine_model_dir, store)
    assert run(second, prompts) == ref
    assert second.kv_cache_stats()["disk_hit_tokens"] > 0
    second.engine.shutdown()


def test_bad_storage_paths_are_config_errors(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        EngineConfig(persistence={"storage_path": str(f)})
    with pytest.raises(ValueError, match="its parent .*file' is not a directory"):
        EngineConfig(persistence={"storage_path": str(f / "kv")})
    with pytest.raises(ValueError, match="parent directory .* does not exist"):
        EngineConfig(persistence={"storage_path": str(tmp_path / "none" / "kv")})
    with pytest.raises(ValueError, match="unknown key 'persistence.hot'"):
        EngineConfig(persistence={"storage_path": str(tmp_path), "hot": 1})


def test_a_cap_below_one_record_is_refused_at_start(engine_model_dir, tmp_path):
    """max_bytes under one block's record made every write fail, with a warning that did not
    say why."""
    with pytest.raises(ValueError, match=r"persistence.max_bytes=1000 holds no record: one "
                                         r"block's record is (\d+) bytes"):
        engine(engine_model_dir, tmp_path / "kv", persistence={"max_bytes": 1000})
    llm = engine(engine_model_dir, tmp_path / "kv2", persistence={"max_bytes": 64 << 10})
    run(llm, [[1, 5, 9, 12] * 8])
    s = llm.kv_cache_stats()
    assert s["disk_failed_writes"] == 0 and s["disk_records"] > 0, s
    llm.engine.shutdown()


def test_hot_blocks_threshold_writes_only_popular_blocks(engine_model_dir, prompts, tmp_path):
    llm = engine(engine_model_dir, tmp_path / "kv", persistence={"hot_blocks_threshold": 2})
    run(llm, prompts[:1])
    assert llm.kv_cache_stats()["disk_records"] == 0  # computed once: not hot
    run(llm, prompts[:1])  # served once from memory
    assert llm.kv_cache_stats()["disk_records"] == 0
    run(llm, prompts[:1])  # served twice: hot, written
    assert llm.kv_cache_stats()["disk_records"] > 0
    llm.engine.shutdown()


def test_hot_block_counts_are_bounded(engine_model_dir, tmp_path):
    # A block served fewer than hot_blocks_threshold times, then never again, kept its count
    # forever (+1 entry per distinct prompt block of a long-running chat server).
    llm = engine(engine_model_dir, tmp_path / "kv", persistence={"hot_blocks_threshold": 3})
    tier = llm.engine.tier
    tier.max_counted_blocks = 4
    keys = [bytes([i]) * 16 for i in range(10)]
    for k in keys:
        assert not tier.note_served(k)
    assert list(tier._served) == keys[-4:]  # the least recently served forgotten
    assert not tier.note_served(keys[-1]) and tier.note_served(keys[-1])  # the 3rd: hot
    assert keys[-1] not in tier._served and len(tier._served) == 3
    llm.engine.shutdown()


def test_cli_flags_turn_the_tier_on(tmp_path):
    from pagedllm import cli
    from pagedllm.commands.common import engine_config

    args = cli.build_parser().parse_args(["generate", "p", "--persistence-path",
                                          str(tmp_path / "kv"), "--hot-blocks-threshold", "3"])
    cfg = engine_config(args)
    assert cfg.persistence.enabled and cfg.persistence.hot_blocks_threshold == 3
    assert cfg.persistence.storage_path == str(tmp_path / "kv")


def test_info_reports_the_store(engine_model_dir, prompts, tmp_path):
    from pagedllm.commands.info import store_facts
    from pagedllm.persistence_config import PersistenceConfig

    cfg = PersistenceConfig(enabled=True, storage_path=str(tmp_path / "kv"))
    assert store_facts(cfg)["state"] == "not created yet"
    llm = engine(engine_model_dir, tmp_path / "kv")
    run(llm, prompts)
    assert store_facts(cfg)["state"].startswith("cannot open")  # held by the running engine
    llm.engine.shutdown()
    facts = store_facts(cfg)
    assert facts["state"] == "ok" and facts["records"] > 0 and facts["bytes"] > 0


def test_shared_prefixes_load_from_disk_without_prefix_caching(engine_model_dir, prompts,
                                                                tmp_path):
    """Without the memory prefix cache, prompts that share blocks each load them from disk into
    blocks of their own, in one step (the staged buffers were keyed by block alone, so the
    second load of a key failed the whole step: every request came back empty)."""
    plain = LLM(engine_model_dir, block_size=8, num_kv_blocks=256, enable_prefix_caching=False)
    ref = [o.outputs[0].token_ids for o in plain.generate(tok(prompts), greedy(),
                                                             use_tqdm=False)]
    store = tmp_path / "kv"
    first = engine(engine_model_dir, store, enable_prefix_caching=False)
    assert run(first, prompts) == ref
    first.engine.shutdown()
    again = engine(engine_model_dir, store, enable_prefix_caching=False)
    assert run(again, prompts) == ref
    s = again.kv_cache_stats()
    assert again.engine.num_failed_steps == 0
    assert s["disk_hit_tokens"] >= 8 * len(prompts), s
    assert s["used_blocks"] == 0 and not again.engine.tier._loads
    again.engine.shutdown()


def test_a_tight_cap_keeps_chains_from_their_roots(engine_model_dir, prompts, tmp_path):
    """Under max_bytes the store must evict a prompt's blocks from the tail: lookups walk from
    the root and stop at the first missing block. Plain LRU evicted the roots (written and read
    first) and kept unreachable tails: a restart then hit nothing."""
    probe = engine(engine_model_dir, tmp_path / "probe")
    run(probe, prompts[:1])
    s = probe.kv_cache_stats()
    record = s["disk_bytes"] // s["disk_records"]
    probe.engine.shutdown()
    store = tmp_path / "kv"
    cap = {"max_bytes": 6 * record + record // 2}
    long = mixed_prompts(3, seed=5, lo=100, hi=120)  # 12-15 blocks each, the cap holds 6
    first = engine(engine_model_dir, store, persistence=cap)
    ref = run(first, long)
    s = first.kv_cache_stats()
    assert s["disk_evictions"] > 0 and s["disk_records"] <= 6, s
    first.engine.shutdown()
    again = engine(engine_model_dir, store, persistence=cap)
    assert run(again, long) == ref
    s = again.kv_cache_stats()
    assert s["disk_hit_tokens"] >= 4 * 8, s  # the kept records are roots, so they are read
    again.engine.shutdown()


def test_shared_blocks_are_read_from_disk_once(engine_model_dir, prompts, tmp_path):
    """Two waiting prompts that share a prefix: the second waits for the first's read and then
    hits memory, instead of reading the same records again."""
    store = tmp_path / "kv"
    first = engine(engine_model_dir, store)
    ref = run(first, prompts)
    first.engine.shutdown()
    again = engine(engine_model_dir, store)
    pair = prompts[-2:]  # both start with the same 48 tokens (6 blocks of 8)
    assert run(again, pair) == ref[-2:]
    s = again.kv_cache_stats()
    assert s["disk_hits"] == 6, s
    assert s["prefix_cache_hits"] >= 48, s
    again.engine.shutdown()
