"""Choosing the CPU attention engine: the default, set_cpu_engine, PAGEDLLM_CPU_ENGINE, and the
errors for engines that are unknown, not compiled in, or beyond this CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pagedllm

from cpu_engines import ENGINES, OPT_IN_ENGINES, restore
from pagedllm import _core

# The pagedllm this test imports (the installed wheel in CI, the source tree in development).
PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pagedllm.__file__)))


def test_default_is_the_best_available():
    available = _core.cpu_engines()
    exact = [e for e in available if e not in OPT_IN_ENGINES]
    assert exact[-1] == "generic"
    assert available == [e for e in ENGINES + OPT_IN_ENGINES if e in available]  # best first
    assert set(available) <= set(_core.build_info()["cpu_kernels_compiled"])
    restore()
    assert _core.get_cpu_engine() == available[0] == _core.cpu_kernel()


def test_set_each_available_engine_and_back():
    try:
        for name in _core.cpu_engines():
            _core.set_cpu_engine(name)
            assert _core.get_cpu_engine() == name
        _core.force_generic_kernels(True)
        assert _core.get_cpu_engine() == "generic"
    finally:
        restore()
    assert _core.get_cpu_engine() == _core.cpu_engines()[0]


def test_unknown_or_unavailable_engine_is_a_clear_error():
    before = _core.get_cpu_engine()
    with pytest.raises(ValueError, match="unknown CPU engine 'sse9'"):
        _core.set_cpu_engine("sse9")
    for name in ENGINES + OPT_IN_ENGINES:
        if name not in _core.cpu_engines():
            with pytest.raises(ValueError, match=name):
                _core.set_cpu_engine(name)
    assert _core.get_cpu_engine() == before  # unchanged by a failed call


def test_avx512_needs_its_features():
    features = set(_core.build_info()["cpu_features"])
    has = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"} <= features
    if "avx512" in _core.build_info()["cpu_kernels_compiled"]:
        assert ("avx512" in _core.cpu_engines()) == has


def test_avx512_bf16_needs_its_features_and_is_opt_in():
    features = set(_core.build_info()["cpu_features"])
    has = {"avx512bf16", "avx512vbmi", "avx512f", "avx512bw", "avx512vl", "avx512dq"} <= features
    if "avx512_bf16" in _core.build_info()["cpu_kernels_compiled"]:
        assert ("avx512_bf16" in _core.cpu_engines()) == has
    restore()
    assert _core.get_cpu_engine() != "avx512_bf16"  # "auto" keeps the exact engines


def run_with_env(value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PAGEDLLM_CPU_ENGINE=value,
               PYTHONPATH=os.pathsep.join([PYTHON_DIR, os.environ.get("PYTHONPATH", "")]))
    code = ("import torch; from pagedllm import _core; q = torch.zeros(1, 2, 8); "
            "c = torch.zeros(1, 2, 4, 8); t = torch.zeros(1, 1, dtype=torch.int32); "
            "_core.paged_attention_decode(torch.empty_like(q), q, c, c, t, "
            "torch.ones(1, dtype=torch.int32), 1.0); print(_core.get_cpu_engine())")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_environment_variable_forces_an_engine():
    for name in _core.cpu_engines():
        r = run_with_env(name)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == name
    r = run_with_env("auto")
    assert r.stdout.strip() == _core.cpu_engines()[0], r.stderr


def test_environment_variable_with_a_bad_engine_fails_the_call():
    r = run_with_env("bogus")
    assert r.returncode != 0
    assert "PAGEDLLM_CPU_ENGINE" in r.stderr and "bogus" in r.stderr


def test_a_bad_engine_in_the_environment_is_a_usage_error_before_the_model_loads():
    # It failed the first step's requests (exit 1, several lines), unlike every other bad
    # setting (one line, exit 2).
    env = dict(os.environ, PAGEDLLM_CPU_ENGINE="bogus",
               PYTHONPATH=os.pathsep.join([PYTHON_DIR, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pagedllm", "generate", "--max-tokens", "2", "hi"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("pagedllm: error: PAGEDLLM_CPU_ENGINE: unknown CPU engine 'bogus'")
