"""Failure modes of the multiprocessing tensor-parallel executor: a rank killed mid-request, a
rank that stops (SIGSTOP) past distributed_timeout_s, the driver killed (its ranks exit by
themselves), and the one-line errors of combinations that cannot run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from engine_fixtures import engine_model_dir, greedy, mixed_prompts, tok  # noqa: F401
from pagedllm import LLM
from pagedllm.engine.executor import ExecutorDeadError
from tp_fixtures import alive, signal_rank_mid_request, wait_gone, worker_pids

pytestmark = pytest.mark.slow


def test_killed_rank_fails_the_engine_naming_it_and_leaves_no_process(engine_model_dir):
    llm = LLM(engine_model_dir, num_kv_blocks=200, num_threads=1, tensor_parallel_size=2,
              distributed_timeout_s=120)
    pids = worker_pids(llm)
    err = signal_rank_mid_request(llm, signal.SIGKILL, mixed_prompts(4, seed=1))
    assert isinstance(err, ExecutorDeadError), err
    # named, and found by the death, not by the 120 s deadline
    assert f"rank 1 (pid {pids[1]}) died (killed by signal 9)" in str(err)
    assert "no answer within" not in str(err)
    assert wait_gone(pids) == []
    with pytest.raises(ExecutorDeadError, match="rank 1"):  # and it stays dead
        llm.generate(tok([[5, 6, 7]]), greedy(2))
    llm.engine.shutdown()


def test_stopped_rank_times_out_naming_it(engine_model_dir):
    llm = LLM(engine_model_dir, num_kv_blocks=200, num_threads=1, tensor_parallel_size=2,
              distributed_timeout_s=5)
    pids = worker_pids(llm)
    err = signal_rank_mid_request(llm, signal.SIGSTOP, mixed_prompts(4, seed=2))
    assert isinstance(err, ExecutorDeadError), err
    message = str(err)
    assert "no answer within 5 s (distributed_timeout_s)" in message
    assert f"rank 1 (pid {pids[1]}) stopped first" in message
    assert wait_gone(pids) == []  # the stopped rank is killed too
    llm.engine.shutdown()


def test_ranks_exit_when_the_driver_is_killed(engine_model_dir, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal
        from pagedllm import LLM
        if __name__ == "__main__":
            llm = LLM({engine_model_dir!r}, num_kv_blocks=64, num_threads=1,
                      tensor_parallel_size=2)
            print(*llm.engine.executor.worker_pids, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    assert wait_gone(pids) == [], [p for p in pids if alive(p)]


@pytest.mark.parametrize("options, match", [
    (dict(tensor_parallel_size=3), "tensor_parallel_size=3 must divide num_attention_heads=4"),
    (dict(tensor_parallel_size=8),
     "tensor_parallel_size=8 must divide num_attention_heads=4"),
    (dict(tensor_parallel_size=2, device="cuda"), "tensor_parallel_size=2 needs 2 GPUs"),
    (dict(tensor_parallel_size=2, distributed_executor_backend="mpi"),
     "distributed_executor_backend must be one of mp, ray"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1"),
    (dict(tensor_parallel_size=2, distributed_timeout_s=0),
     "distributed_timeout_s must be a positive number"),
])
def test_bad_combinations_are_one_line_errors_naming_the_option(engine_model_dir, options,
                                                                 match):
    with pytest.raises(ValueError, match=match) as info:
        LLM(engine_model_dir, num_kv_blocks=16, **options)
    assert "\n" not in str(info.value)


def test_an_option_every_rank_refuses_is_the_plain_error(engine_model_dir):
    with pytest.raises(ValueError, match=r"swap_space=1e-09 GiB holds no KV block") as info:
        LLM(engine_model_dir, num_kv_blocks=16, num_threads=1, tensor_parallel_size=2,
            preemption_mode="swap", swap_space=1e-9)
    assert not isinstance(info.value, ExecutorDeadError)


def test_ray_backend_without_ray_names_the_option(engine_model_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ValueError, match=r"distributed_executor_backend='ray' needs the ray "
                                         r"package \(pip install 'pagedllm\[ray\]'\)"):
        LLM(engine_model_dir, num_kv_blocks=16, tensor_parallel_size=2,
            distributed_executor_backend="ray")


def test_cli_names_the_flag(engine_model_dir, capsys):
    from pagedllm.cli import main

    code = main(["generate", "--model", engine_model_dir, "-tp", "3", "hello",
                 "--num-kv-blocks", "16"])
    err = capsys.readouterr().err
    assert code == 2  # options no engine can be built from: a usage error
    assert err.count("\n") == 1
    assert "tensor_parallel_size=3 must divide num_attention_heads=4" in err
    assert "--tensor-parallel-size" in err
