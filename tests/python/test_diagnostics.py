"""Diagnostics and tuning (issue 17): block_size="auto", the OOM table as errors and warnings,
the KV metrics behind it, numeric checks on the logits (per-layer checks: test_numerics_layers.py;
traces: test_tracing.py)."""

from __future__ import annotations

import argparse
import logging

import pytest

from engine_fixtures import assert_pool_clean, engine_model_dir, mixed_prompts  # noqa: F401
from pagedllm import LLM, SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.engine.kv_sizing import (GPU_BLOCK_SIZE_TABLE, resolve_block_size, seed_rule,
                                       watermark_block_count)


def greedy(max_tokens=8):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def tok(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


# --- block_size="auto" --------------------------------------------------------------------------
@pytest.mark.parametrize("mean, expected", [(1, 16), (100, 16), (160, 16), (161, 32), (191, 32),
                                            (640, 64), (1000, 128), (2000, 256), (100000, 256)])
def test_auto_block_size_on_declared_lengths(mean, expected):
    cfg = EngineConfig(block_size="auto", expected_mean_seq_len=mean)
    bs, why = resolve_block_size(cfg, model_max_len=4096)
    assert bs == expected
    assert f"expected_mean_seq_len={mean}" in why
    if seed_rule(mean) > 256:
        assert "bounded to 256 by the kernels" in why


def test_auto_block_size_without_a_declared_length_uses_max_model_len_and_says_so():
    bs, why = resolve_block_size(EngineConfig(block_size="auto"), model_max_len=1024)
    assert bs == 128 and "max_model_len=1024" in why and "proxy" in why
    bs, why = resolve_block_size(EngineConfig(block_size="auto", max_model_len=300), 1024)
    assert bs == 32 and "max_model_len=300" in why


def test_auto_block_size_gpu_table_is_unmeasured_and_explicit_sizes_pass_through():
    assert GPU_BLOCK_SIZE_TABLE == {}  # nothing measured on a GPU yet: no copied numbers
    bs, why = resolve_block_size(EngineConfig(block_size="auto", expected_mean_seq_len=640),
                                 4096, gpu_arch="9.0")
    assert bs == 64 and "no measured GPU table entry" in why
    assert resolve_block_size(EngineConfig(block_size=8), 4096) == (8, "configured")


def test_auto_block_size_config_yaml_and_cli(tmp_path):
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size="big")
    with pytest.raises(ValueError, match="expected_mean_seq_len"):
        EngineConfig(block_size="auto", expected_mean_seq_len=0)
    path = tmp_path / "c.yaml"
    path.write_text("kv_cache:\n  block_size: auto\n  expected_mean_seq_len: 500\n")
    cfg = EngineConfig.from_yaml(str(path))
    assert cfg.block_size == "auto" and cfg.expected_mean_seq_len == 500
    from pagedllm.commands.common import add_engine_args, engine_config

    p = argparse.ArgumentParser()
    add_engine_args(p)
    cfg = engine_config(p.parse_args(["--block-size", "auto", "--expected-mean-seq-len", "300"]))
    assert cfg.block_size == "auto" and cfg.expected_mean_seq_len == 300
    assert engine_config(p.parse_args(["--block-size", "8"])).block_size == 8


def test_auto_block_size_in_the_engine(engine_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="pagedllm"):
        llm = LLM(engine_model_dir, block_size="auto", expected_mean_seq_len=300,
                  num_kv_blocks=32)
    assert any("block_size=auto" in r.getMessage() and "= 32" in r.getMessage()
               for r in caplog.records)
    stats = llm.kv_cache_stats()
    assert stats["block_size"] == 32 and "expected_mean_seq_len=300" in stats["block_size_reason"]
    assert llm.engine.config.block_size == "auto"
    outs = llm.generate(tok(mixed_prompts(4, seed=3, hi=40)), greedy(), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    # The same tokens as an explicit block size of 32.
    ref = LLM(engine_model_dir, block_size=32, num_kv_blocks=32)
    refs = ref.generate(tok(mixed_prompts(4, seed=3, hi=40)), greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in refs]
    assert_pool_clean(llm)


# --- the OOM table as behaviour ---------------------------------------------------------------
from pagedllm.engine import kv_diagnostics as kd  # noqa: E402


def _stats(**kw):
    s = dict(num_blocks=100, block_size=16, used_blocks=100, cached_blocks=0, free_blocks=0,
             slots_reserved=1600, slots_empty=100, prefix_cache_queries=0, prefix_cache_hits=0,
             shared_blocks=0)
    s.update(kw)
    return s


def test_pressure_short_sequences_mean_block_too_large():
    d = kd.diagnose_pressure(_stats(block_size=64, slots_reserved=6400, slots_empty=3200),
                             num_running=4, mean_seq_len=40, prefix_caching=True)
    assert d.symptom == kd.SHORT_OOM and "block too large" in d.cause
    assert "block_size" in d.knob and "now 64" in d.knob
    assert "block_size=auto with expected_mean_seq_len=40: 16" in d.knob
    assert "3200 empty slots in held blocks (50.0%)" in d.numbers
    # "auto" never goes under 16: not advised where the block is 16 already
    d = kd.diagnose_pressure(_stats(block_size=16, slots_reserved=1600, slots_empty=500),
                             num_running=50, mean_seq_len=22, prefix_caching=True)
    assert d.symptom == kd.SHORT_OOM and "now 16, e.g. 8" in d.knob and "auto" not in d.knob


def test_pressure_long_sequences_mean_too_few_blocks():
    d = kd.diagnose_pressure(_stats(), num_running=3, mean_seq_len=900, prefix_caching=True)
    assert d.symptom == kd.LONG_OOM and "too few blocks" in d.cause
    assert "num_kv_blocks" in d.knob and "kv_cache_memory_bytes" in d.knob
    assert "0 free of 100" in d.numbers and "0 cached (evictable)" in d.numbers


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_pressure_under_concurrency_means_prefix_sharing_not_working(prefix_caching):
    s = _stats(shared_blocks=1, prefix_cache_queries=1000, prefix_cache_hits=10)
    d = kd.diagnose_pressure(s, num_running=32, mean_seq_len=200, prefix_caching=prefix_caching)
    assert d.symptom == kd.CONCURRENCY_OOM
    assert "enable_prefix_caching" in d.cause + d.knob
    if prefix_caching:
        assert "not working" in d.cause and "1 of 100 held blocks shared" in d.cause
        assert "hit rate 1.0%" in d.cause
    # Sharing that works is not this symptom: the pool is just too small.
    d = kd.diagnose_pressure(_stats(shared_blocks=40), num_running=32, mean_seq_len=200,
                             prefix_caching=True)
    assert d.symptom == kd.LONG_OOM


def test_shared_blocks_counts_distinct_blocks_held_twice():
    assert kd.count_shared_blocks([[0, 1, 2], [0, 1, 3], [7]]) == 2
    assert kd.count_shared_blocks([]) == 0
    import numpy as np

    padded = np.array([[0, 1, 0], [0, 1, 2], [3, 0, 0]])  # padded with 0; block 0 held twice
    assert kd.count_shared_blocks(padded, {0: 2}.get) == 2
    assert kd.count_shared_blocks(padded, {0: 1}.get) == 1


def test_preemption_storm_warning_is_rate_limited(caplog):
    now = [0.0]
    m = kd.PreemptionMonitor(window_steps=4, threshold=5, interval_s=10.0, clock=lambda: now[0])
    diag = kd.Diagnosis(kd.LONG_OOM, "too few blocks", "raise num_kv_blocks", "0 free of 8")
    total = 0
    with caplog.at_level(logging.WARNING, logger="pagedllm"):
        for step in range(40):
            total += 2
            now[0] = step * 0.5  # 20 s in all: at most one warning per 10 s -> 2
            m.observe(total, lambda: diag)
    warnings = [r.getMessage() for r in caplog.records if "preemption storm" in r.getMessage()]
    assert len(warnings) == 2 == m.num_warnings
    assert "6 preemptions in the last 3 steps (2.00 per step)" in warnings[0]
    assert "8 preemptions in the last 4 steps (2.00 per step)" in warnings[1]
    assert "too few blocks" in warnings[0] and "num_kv_blocks" in warnings[0]
    assert m.last_step == 2 and m.per_step == 2.0
    # Quiet steps drain the window: no storm, no warning.
    for step in range(8):
        now[0] = 100.0 + step
        assert m.observe(total, lambda: diag) is None
    assert m.per_step == 0.0


def test_admission_error_too_few_blocks_names_figures_that_work():
    # Reached when the pool does not bound max_model_len (block-sparse streaming): the whole
    # sequence needs more blocks than the pool has; its prompt alone fits.
    stats = {"num_blocks": 20, "free_blocks": 20, "block_size": 4}
    msg = kd.admission_error("r", 60, 100, 25, 15, 20, 0, 4, 4096, stats, 0.0)
    assert msg.startswith("request r: " + kd.LONG_OOM)
    assert "too few blocks: 20 blocks hold 80 tokens" in msg
    assert "100 tokens need 25 KV blocks but the pool has 20" in msg
    assert "raise num_kv_blocks to at least 25 or kv_cache_memory_bytes to at least 102400" in msg
    assert "lower max_tokens to at most 20" in msg and "watermark" not in msg.split("Knob:")[1]


@pytest.mark.parametrize("num_blocks", [20, 25])
def test_admission_error_watermark_names_it_and_figures_that_work(engine_model_dir, num_blocks):
    # A 60-token prompt (15 blocks) with half the pool kept free: the error said "raise
    # num_kv_blocks to at least 25", which was refused again ("at least 27"); 29 is the first
    # that admits it, and max_tokens cannot help a prompt.
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=num_blocks, watermark=0.5)
    with pytest.raises(ValueError) as e:
        llm.engine.add_request("r", {"prompt_token_ids": list(range(3, 63))}, greedy(4))
    msg = str(e.value)
    assert "needs 15 to be admitted" in msg and "the watermark keeps" in msg
    assert "raise num_kv_blocks to at least 29" in msg and "max_tokens" not in msg
    # num_kv_blocks sized this pool: a kv_cache_memory_bytes would be ignored, so not advised
    assert "kv_cache_memory_bytes" not in msg
    most = float(msg.split("lower watermark to at most ")[1].split(",")[0])
    for options in (dict(num_kv_blocks=29, watermark=0.5), dict(num_kv_blocks=num_blocks,
                                                                 watermark=most)):
        ok = LLM(engine_model_dir, block_size=4, **options)
        ok.generate([{"prompt_token_ids": list(range(3, 63))}], greedy(4), use_tqdm=False)


def test_blocks_to_admit_is_the_least_that_admits():
    for watermark in (0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.99):
        for admit in range(1, 60):
            for need in (admit, admit + 7):
                n = kd.blocks_to_admit(need, admit, watermark)
                fits = [m >= need and m - watermark_block_count(watermark, m) >= admit
                        for m in (n - 1, n)]
                assert fits == [False, True], (watermark, admit, need, n)


def test_a_short_request_is_never_blamed_on_the_block_size(engine_model_dir):
    # A single request fits iff its tokens fit the admissible slots, whatever the block size:
    # the error used to advise a smaller block (short sequences), which was refused again.
    llm = LLM(engine_model_dir, block_size=64, num_kv_blocks=3, watermark=0.5)
    with pytest.raises(ValueError) as e:
        llm.engine.add_request("r", {"prompt_token_ids": list(range(3, 153))}, greedy(4))
    msg = str(e.value)
    assert kd.SHORT_OOM not in msg and "block_size" not in msg.split("Knob:")[1]
    assert "raise num_kv_blocks to at least 5" in msg and "lower watermark to at most 0," in msg


def test_preemption_storm_on_the_real_engine(engine_model_dir, caplog):
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=40, max_num_batched_tokens=64,
              max_num_seqs=32, watermark=0.0)
    llm.engine.kv_monitor.threshold = 4
    with caplog.at_level(logging.WARNING, logger="pagedllm"):
        outs = llm.generate(tok(mixed_prompts(24, seed=7)), greedy(12), use_tqdm=False)
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    stats = llm.kv_cache_stats()
    assert stats["num_preemptions"] >= 4
    warnings = [r.getMessage() for r in caplog.records if "preemption storm" in r.getMessage()]
    assert warnings and llm.engine.kv_monitor.num_warnings == len(warnings)
    d = llm.engine.kv_monitor.last_diagnosis
    assert d.symptom in (kd.SHORT_OOM, kd.LONG_OOM, kd.CONCURRENCY_OOM)
    assert "free of 40" in warnings[0] and "Knob:" in warnings[0]
    assert_pool_clean(llm)


# --- KV metrics (/metrics, monitor) -------------------------------------------------------------
def _scrape(metrics):
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for fam in text_string_to_metric_families(metrics.render().decode())
            for s in fam.samples}


def _drain(engine, seen):
    while engine.has_unfinished_requests():
        engine.step()
        s = engine.kv_cache_stats()
        for k in ("shared_blocks", "preemptions_last_step", "slots_empty"):
            seen[k] = max(seen.get(k, 0), s[k])


def test_kv_metrics_move_on_a_scripted_workload(engine_model_dir):
    from pagedllm.metrics import EngineMetrics

    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=24, watermark=0.0,
              max_num_seqs=8, max_num_batched_tokens=64)
    engine = llm.engine
    m = EngineMetrics(engine.kv_cache_stats, "t")
    P = "pagedllm:"
    got = _scrape(m)
    assert got[P + "kv_cache_free_blocks"] == 24 and got[P + "kv_cache_cached_blocks"] == 0
    assert got[P + "kv_cache_shared_blocks"] == 0 and got[P + "kv_cache_evictions_total"] == 0
    prompt = list(range(10, 40))  # 30 tokens: 7 full blocks + a partial one
    # 1. Two samples of one prompt share its blocks; their first tokens copy the partial block.
    engine.add_request("fork", {"prompt_token_ids": prompt},
                       SamplingParams(n=2, temperature=1.0, max_tokens=4, ignore_eos=True, seed=1))
    engine.step()
    got = _scrape(m)
    assert got[P + "kv_cache_shared_blocks"] >= 7
    assert got[P + "kv_cache_free_blocks"] < 24
    assert got[P + "kv_cache_empty_slots"] > 0
    assert 0 < got[P + "kv_cache_internal_fragmentation"] < 1
    seen = {}
    _drain(engine, seen)
    got = _scrape(m)
    assert got[P + "kv_cache_cow_copies_total"] >= 1
    assert got[P + "kv_cache_cached_blocks"] >= 7  # freed, kept in the prefix cache
    assert got[P + "kv_cache_shared_blocks"] == 0 and got[P + "kv_cache_empty_slots"] == 0
    # 2. The same prompt again hits the prefix cache.
    before = got[P + "prefix_cache_hit_rate"]
    engine.add_request("again", {"prompt_token_ids": prompt}, greedy(2))
    _drain(engine, seen)
    got = _scrape(m)
    assert got[P + "prefix_cache_hit_rate"] > before
    assert got[P + "prefix_cache_hits_total"] >= 28
    # 3. Distinct prompts that overfill the pool evict the cached blocks and preempt.
    for i, p in enumerate(mixed_prompts(5, seed=11, lo=40, hi=50)):
        engine.add_request(f"big{i}", {"prompt_token_ids": p}, greedy(20))
    _drain(engine, seen)
    got = _scrape(m)
    assert got[P + "kv_cache_evictions_total"] >= 1
    assert got[P + "num_preemptions_total"] >= 1 and seen["preemptions_last_step"] >= 1
    assert got[P + "preemptions_per_step"] > 0
    assert_pool_clean(llm)


def test_monitor_shows_the_kv_table_figures():
    from pagedllm.commands import monitor

    P = "pagedllm:"
    samples = {P + "kv_cache_free_blocks": 5.0, P + "kv_cache_cached_blocks": 7.0,
               P + "kv_cache_empty_slots": 30.0, P + "kv_cache_reserved_slots": 120.0,
               P + "kv_cache_shared_blocks": 3.0, P + "kv_cache_evictions_total": 11.0,
               P + "kv_cache_cow_copies_total": 2.0, P + "preemptions_last_step": 4.0,
               P + "preemptions_per_step": 0.75, P + "prefix_cache_queries_total": 10.0,
               P + "prefix_cache_hits_total": 5.0}
    views = monitor.resolve_metrics(["free_blocks,cached_blocks,fragmentation,shared_blocks",
                                     "evictions,cow_copies,preemption_rate,prefix_hits"])
    lines = monitor.render("http://x", views, (1.0, samples), None)
    body = "\n".join(lines)
    for label, value in [("free blocks", "5"), ("cached blocks (evictable)", "7"),
                         ("shared blocks", "3"), ("evictions", "11"),
                         ("copy-on-write copies", "2")]:
        assert any(l.strip().startswith(label) and l.split()[-1] == value for l in lines), label
    assert "25.0% (30 empty of 120 slots)" in body
    assert "4 last step, 0.75 per step" in body
    assert "50.0% (5/10 tokens)" in body
    assert set(monitor.VIEWS) >= {"free_blocks", "cached_blocks", "fragmentation",
                                  "shared_blocks", "evictions", "cow_copies", "preemption_rate"}


# --- numeric checks -------------------------------------------------------------------------------
MARK = 511  # token id whose embedding the test poisons with NaN


def _poison(llm):
    """NaN in the activations of every token equal to MARK (a forward hook on the embedding):
    the request holding one gets non-finite hidden states, K/V and logits from there on."""
    import torch

    model = llm.engine.executor.worker.model

    def hook(module, args, output):
        (ids,) = args
        output[ids == MARK] = float("nan")
        return output
    return model.embed_tokens.register_forward_hook(hook)


@pytest.fixture
def numeric_prompts():
    good = mixed_prompts(3, seed=21, lo=10, hi=30)
    bad = mixed_prompts(1, seed=22, lo=20, hi=20)[0]
    bad[12] = MARK
    return good, bad


def test_check_numerics_config_yaml_cli(tmp_path):
    assert EngineConfig().check_numerics == "off"
    with pytest.raises(ValueError, match="check_numerics"):
        EngineConfig(check_numerics="loud")
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\n  check_numerics: fail\n")
    assert EngineConfig.from_yaml(str(path)).check_numerics == "fail"
    path.write_text("runtime:\n  check_numerics: off\n")  # YAML's off is false
    assert EngineConfig.from_yaml(str(path)).check_numerics == "off"
    from pagedllm.commands.common import add_engine_args, engine_config

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_config(p.parse_args(["--check-numerics", "warn"])).check_numerics == "warn"


def test_check_numerics_fail_fails_that_request_alone_and_leaks_nothing(
        engine_model_dir, numeric_prompts, caplog):
    good, bad = numeric_prompts
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64, check_numerics="fail")
    ref = LLM(engine_model_dir, block_size=4, num_kv_blocks=64)
    expected = [o.outputs[0].token_ids for o in ref.generate(tok(good + [bad]), greedy(),
                                                             use_tqdm=False)]
    handle = _poison(llm)
    with caplog.at_level(logging.ERROR, logger="pagedllm"):
        outs = llm.generate(tok(good[:1] + [bad] + good[1:]), greedy(), use_tqdm=False)
    handle.remove()
    failed = outs[1]
    assert failed.outputs[0].finish_reason == "error"
    # The per-layer probe finds it where it starts: the embedding of the marked token.
    assert ("numeric check: NaN/Inf in the output of the embeddings (model.embed_tokens) at "
            f"position 12 of request {failed.request_id}") in failed.error, failed.error
    assert any("numeric check" in r.getMessage() for r in caplog.records)
    others = [outs[0]] + outs[2:]
    assert [o.outputs[0].finish_reason for o in others] == ["length"] * 3
    assert [o.outputs[0].token_ids for o in others] == expected[:3]
    assert llm.kv_cache_stats()["num_numeric_errors"] >= 1
    assert_pool_clean(llm)
    # Nothing poisoned stays in the prefix cache: the same prompt, unpoisoned, gives the
    # reference's tokens (its blocks are computed again, not served from the NaN ones).
    (again,) = llm.generate(tok([bad]), greedy(), use_tqdm=False)
    assert again.outputs[0].finish_reason == "length", again.error
    assert again.outputs[0].token_ids == expected[3]


def test_check_numerics_warn_and_off(engine_model_dir, numeric_prompts, caplog):
    good, bad = numeric_prompts
    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64, check_numerics="warn")
    handle = _poison(llm)
    with caplog.at_level(logging.WARNING, logger="pagedllm"):
        outs = llm.generate(tok([good[0], bad]), greedy(2), use_tqdm=False)
    handle.remove()
    warned = [r.getMessage() for r in caplog.records if "numeric check" in r.getMessage()]
    assert warned and f"of request {outs[1].request_id}" in warned[0] and "step" in warned[0]
    assert outs[0].outputs[0].finish_reason == "length"
    off = LLM(engine_model_dir, block_size=4, num_kv_blocks=64)
    handle = _poison(off)
    off.generate(tok([good[0], bad]), greedy(2), use_tqdm=False)
    handle.remove()
    assert off.kv_cache_stats()["num_numeric_errors"] == 0


def test_check_numerics_finds_inf_and_ignores_finite_overflowing_rows(engine_model_dir):
    """The row-sum prefilter: an Inf row is found; a finite row whose sum overflows is not."""
    import torch

    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64, check_numerics="fail")
    engine = llm.engine
    seen = {}
    real = engine.numerics.check

    def tamper(out, step, faults, logits):
        with torch.inference_mode():
            for t in out.sample_targets:
                if t.seq.request.request_id == "inf":
                    logits[t.row, 5] = float("inf")
                elif t.seq.request.request_id == "big":
                    logits[t.row, :] = 3e38  # finite; the row's sum overflows
        seen["called"] = True
        return real(out, step, faults, logits)
    engine.numerics.check = tamper
    for rid in ("inf", "big"):
        engine.add_request(rid, {"prompt_token_ids": [5, 6, 7]}, greedy(2))
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
    assert seen["called"]
    assert outs["inf"].outputs[0].finish_reason == "error" and "request inf" in outs["inf"].error
    assert "NaN/Inf in the logits (logits row" in outs["inf"].error
    assert outs["big"].outputs[0].finish_reason == "length"
    assert_pool_clean(llm)


@pytest.mark.parametrize("options,advice,not_advised", [
    # num_kv_blocks wins over kv_cache_memory_bytes: a larger byte budget would not help
    (dict(num_kv_blocks=4, kv_cache_memory_bytes=1 << 20), "Raise num_kv_blocks to at least 25",
     "kv_cache_memory_bytes"),
    (dict(kv_cache_memory_bytes=4 * 4096), "Raise kv_cache_memory_bytes (to at least 102400) or "
     "set num_kv_blocks (to at least 25)", None),
])
def test_max_model_len_that_does_not_fit_names_the_knob_that_works(options, advice, not_advised):
    from pagedllm.config import EngineConfig
    from pagedllm.engine.kv_sizing import plan_kv_pool

    config = EngineConfig(block_size=4, max_model_len=100, **options)
    with pytest.raises(ValueError) as e:
        plan_kv_pool(config, 4096, 512)
    assert advice in str(e.value) and "lower max_model_len to 16 or less" in str(e.value)
    if not_advised:
        assert not_advised not in str(e.value).split(". ")[-1]


@pytest.mark.parametrize("options,match", [
    (dict(kv_cache_memory_bytes=8 << 20), r"the KV pool \(\d+ blocks of 4 tokens, "
     r"kv_cache_memory_bytes=8388608\) takes 8.0 MiB, but this host has \d+\.\d MiB available; "
     r"lower kv_cache_memory_bytes$"),
    (dict(num_kv_blocks=4096), r"num_kv_blocks=4096\) takes .* lower num_kv_blocks$"),
    (dict(num_kv_blocks=64, preemption_mode="swap", swap_space=1.0),
     r"with its host swap pool \(swap_space=1.0 GiB\) takes .* lower num_kv_blocks or swap_space$"),
])
def test_a_pool_larger_than_the_memory_left_is_refused_naming_the_option(
        engine_model_dir, monkeypatch, options, match):
    # A 200 GiB --kv-cache-memory failed inside torch's allocator ("please report it").
    from pagedllm.engine import device as devices

    pool = 64 * LLM(engine_model_dir, block_size=4, num_kv_blocks=1).engine.plan.bytes_per_block
    monkeypatch.setattr(devices, "_host_available_bytes", lambda: pool - 1)
    with pytest.raises(ValueError, match=match):
        LLM(engine_model_dir, block_size=4, **options)
    monkeypatch.setattr(devices, "_host_available_bytes", lambda: pool)
    LLM(engine_model_dir, block_size=4, num_kv_blocks=64)  # exactly what is left: accepted


def test_every_served_metric_is_documented(engine_model_dir):
    # /metrics served pagedllm:num_requests_swapped and num_failed_steps_total that USAGE.md
    # never named, and USAGE.md promised sparse_read_fraction / sparse_blocks_dropped there.
    import os
    import re

    from pagedllm.metrics import EngineMetrics

    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=24)
    names = {re.sub(r"_(total|count|sum|bucket|created)$", "", n).removeprefix("pagedllm:")
             for n in _scrape(EngineMetrics(llm.engine.kv_cache_stats, "t"))}
    usage = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "USAGE.md"),
                 encoding="utf-8").read()
    missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}(_total)?\b", usage))
    assert not missing, missing
    for promised in ("sparse_read_fraction", "sparse_blocks_dropped"):
        assert promised in names
