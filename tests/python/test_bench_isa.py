"""benchmarks/isa.py, the emulated AVX2-only runs: the variables, the re-execution that sets
them, what a process under them runs, and how the vLLM worker reports its kernel library."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import isa  # noqa: E402
import pagedllm  # noqa: E402
from pagedllm import _core  # noqa: E402

HAS_AVX2 = "avx2" in _core.cpu_engines()
HAS_AVX512 = "avx512" in _core.cpu_engines()


# The repository root (for `benchmarks`) and the folder of the pagedllm this process imported
# (the source tree in a dev build, site-packages where it is installed): a child's path.
CHILD_PATH = os.pathsep.join([str(ROOT), str(Path(pagedllm.__file__).resolve().parents[1])])


def run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    """code in a fresh interpreter, from the repository root, with env added."""
    full = {**os.environ, **env, "PYTHONPATH": CHILD_PATH}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)


def clean_env() -> dict:
    """This process's environment without any emulation variable."""
    return {k: v for k, v in os.environ.items() if k not in isa.isa_env("avx2")}


def test_the_variables_of_each_isa():
    assert isa.isa_env("native") == {}
    env = isa.isa_env("avx2")
    assert env == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                   "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                   "PAGEDLLM_CPU_ENGINE": "avx2", "PAGEDLLM_LINEAR": "pagedllm",
                   "PAGEDLLM_BENCH_ISA": "avx2"}
    with pytest.raises(ValueError, match=r"unknown instruction set 'avx9'.*native, avx2"):
        isa.isa_env("avx9")


@pytest.mark.skipif(not HAS_AVX2, reason="this CPU has no AVX2")
def test_emulate_re_executes_with_the_variables_and_check_sees_avx2():
    script = """
        import os, sys
        from benchmarks import isa
        isa.emulate("avx2")
        print("argv", sys.argv[1:])
        print("check", isa.check("avx2"))
        print("env", sorted(k for k in isa.isa_env("avx2") if k in os.environ))
    """
    # -c scripts see argv ["-c", ...]: the re-execution keeps the arguments after the script.
    code = textwrap.dedent(script)
    out = subprocess.run([sys.executable, "-c", code, "one", "two"], cwd=ROOT,
                         env={**clean_env(), "PYTHONPATH": CHILD_PATH}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "argv ['one', 'two']" in out.stdout
    assert ("check {'torch_cpu_capability': 'AVX2', 'pagedllm_cpu_engine': 'avx2', "
            "'pagedllm_linear': 'pagedllm'}") in out.stdout
    assert f"env {sorted(isa.isa_env('avx2'))}" in out.stdout


@pytest.mark.skipif(not HAS_AVX512, reason="on a CPU without AVX-512 a native run is AVX2")
def test_check_refuses_a_run_the_emulation_did_not_reach():
    out = run_python("""
        from benchmarks import isa
        print(isa.check("native"))
        try:
            isa.check("avx2")
        except RuntimeError as e:
            print("refused:", e)
    """, {})
    assert out.returncode == 0, out.stderr
    assert "refused: the AVX2 emulation did not take" in out.stdout
    assert "'pagedllm_cpu_engine': 'avx512" in out.stdout


def test_the_vllm_workers_name_the_kernel_library_their_processes_map(tmp_path):
    lib = tmp_path / "vllm" / "_C_AVX2.abi3.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\0" * 4096)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import mmap, sys, time
            f = open({str(lib)!r}, "rb")
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            print("mapped", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
        try:
            import vllm_isa
        finally:
            sys.path.remove(str(ROOT / "benchmarks" / "peers"))
        assert vllm_isa.kernel_libraries(os.getpid()) == ["_C_AVX2.abi3.so"]  # a descendant's
        assert vllm_isa.kernel_libraries(child.pid) == ["_C_AVX2.abi3.so"]  # its own
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert vllm_isa.kernel_libraries(other.pid) == []  # not a sibling's
        finally:
            other.kill()
            other.wait()
    finally:
        child.kill()
        child.wait()
