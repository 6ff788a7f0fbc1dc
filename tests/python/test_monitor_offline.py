"""`pagedllm monitor` on an offline run (issue 17): `generate --stats-file F` keeps the same
figures as a server's /metrics in F, and `monitor --stats-file F` shows them; without a server
or a file, the monitor says what it needs."""

from __future__ import annotations

import pytest

from engine_fixtures import engine_model_dir, greedy, mixed_prompts  # noqa: F401
from pagedllm.commands.monitor import parse, read_stats_file
from pagedllm.commands.stats_file import StatsFileWriter

P = "pagedllm:"


def test_generate_stats_file_then_monitor_reads_it(capsys, tmp_path):
    from pagedllm import cli

    path = tmp_path / "run.prom"
    code = cli.main(["generate", "--num-threads", "1", "--num-kv-blocks", "64", "--temperature",
                     "0", "--max-tokens", "4", "--ignore-eos", "--quiet", "--stats-file",
                     str(path), "Hello", "The list type"])
    _, err = capsys.readouterr()
    assert code == 0, err
    _, samples = read_stats_file(str(path))
    assert samples[P + "generation_tokens_total"] == 8
    assert samples[P + "request_success_total{finished_reason=length}"] == 2
    assert samples[P + "kv_cache_num_blocks"] == 64
    assert samples[P + "kv_cache_used_blocks"] == 0  # written after the last step
    assert samples[P + "e2e_request_latency_seconds_count"] == 2
    assert samples[P + "prompt_tokens_total"] > 0
    code = cli.main(["monitor", "--stats-file", str(path), "--once",
                     "--metric", "requests,cache_usage,free_blocks,gen_throughput"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"pagedllm monitor: {path}")
    assert any("requests finished" in line and line.endswith("length 2") for line in lines)
    assert any("KV cache usage" in line and "(0/64 blocks)" in line for line in lines)
    assert any("free blocks" in line and line.split()[-1].isdigit() for line in lines)
    assert any("generation" in line and line.endswith("-") for line in lines)  # one snapshot


def test_stats_file_is_whole_at_every_write(engine_model_dir, tmp_path):
    from pagedllm import LLM

    llm = LLM(engine_model_dir, block_size=4, num_kv_blocks=64)
    engine = llm.engine
    engine.stream_outputs = True
    path = tmp_path / "s.prom"
    writer = StatsFileWriter(engine, str(path), "m", interval_s=0.0)
    assert parse(path.read_text())[P + "generation_tokens_total"] == 0  # written at once
    for i, p in enumerate(mixed_prompts(2, seed=2, hi=10)):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, greedy(3))
    seen = []
    while engine.has_unfinished_requests():
        writer.after_step(engine.step())
        samples = parse(path.read_text())
        seen.append((samples[P + "generation_tokens_total"], samples[P + "num_requests_running"]))
    assert seen[-1] == (6, 0) and seen[0][0] < 6 and max(r for _, r in seen) == 2
    assert not (tmp_path / "s.prom.tmp").exists()
    with pytest.raises(ValueError, match="does not exist"):
        StatsFileWriter(engine, str(tmp_path / "no" / "f.prom"), "m")


def test_monitor_says_it_needs_a_server_or_a_stats_file(capsys, tmp_path):
    from pagedllm import cli

    code = cli.main(["monitor", "--url", "http://127.0.0.1:9", "--once"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "the monitor needs a running server" in err and "--stats-file FILE" in err, err
    code = cli.main(["monitor", "--stats-file", str(tmp_path / "none.prom"), "--once"])
    _, err = capsys.readouterr()
    assert code == 1 and "none.prom' not found" in err and "generate --stats-file" in err, err
    bad = tmp_path / "bad.prom"
    bad.write_text("this is { not prometheus\n")
    code = cli.main(["monitor", "--stats-file", str(bad), "--once"])
    _, err = capsys.readouterr()
    assert code == 1 and "not in the Prometheus text format" in err, err
    code = cli.main(["monitor", "--url", "http://x", "--stats-file", str(bad), "--once"])
    _, err = capsys.readouterr()
    assert code == 2 and "not both" in err
    code = cli.main(["generate", "--quiet", "--stats-file", str(tmp_path / "no" / "x"), "Hi"])
    _, err = capsys.readouterr()
    assert code == 2 and "fix --stats-file" in err, err


def test_bench_stats_file(capsys, tmp_path):
    from pagedllm import cli

    path = tmp_path / "bench.prom"
    code = cli.main(["bench", "--num-threads", "1", "--num-kv-blocks", "64", "--num-prompts", "3",
                     "--input-len", "8", "--output-len", "4", "--no-progress", "--stats-file",
                     str(path)])
    _, err = capsys.readouterr()
    assert code == 0, err
    _, samples = read_stats_file(str(path))
    assert samples[P + "generation_tokens_total"] == 12
    assert samples[P + "request_success_total{finished_reason=length}"] == 3
