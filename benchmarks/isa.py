"""Benchmark runs on a lesser instruction set than this CPU's: an AVX2-only machine, emulated.

Issue 16 asks for pagedllm ahead of vLLM's CPU build on every x86 machine, AVX2-only ones too;
the development machines have AVX-512. Every engine in such a run is held to what it would run
on a CPU with AVX2 and FMA but no AVX-512:

- torch's own kernels: ATEN_CPU_CAPABILITY=avx2;
- oneDNN (torch's linear layers, pagedllm's where it packs for oneDNN): ONEDNN_MAX_CPU_ISA=AVX2;
- MKL (torch's float32 matmuls): MKL_ENABLE_INSTRUCTIONS=AVX2;
- pagedllm: its avx2 attention engine and fused ops (PAGEDLLM_CPU_ENGINE=avx2), and linear
  layers on its own AVX2 tiles (PAGEDLLM_LINEAR=pagedllm; `_core.linear` follows the attention
  engine), which is what `packed_linear.choose_backend` picks on a CPU without AVX-512 (until
  2026-12-05, twenty-first session, it picked oneDNN there);
- vLLM's CPU build: its AVX2 kernel library (`vllm/_C_AVX2`) in place of the AVX-512 one
  (peers/vllm_isa.py, on PAGEDLLM_BENCH_ISA).

The variables must be set before torch and oneDNN start, so `emulate` re-executes the process
with them. What the core runs differs from a real AVX2-only CPU (its caches, clock and memory
are this machine's), so such figures compare the engines' code paths, not the machines.

Usage: `emulate(isa)` first thing in a benchmark's main, then `check(isa)` for the record.
"""

from __future__ import annotations

import os
import sys
from typing import Dict

ISA_ENV = "PAGEDLLM_BENCH_ISA"  # set in an emulated run (and in its vLLM worker)
ISAS = ("native", "avx2")


def isa_env(isa: str) -> Dict[str, str]:
    """The environment variables of an emulated run.

    Args:
        isa: "native" (nothing held back) or "avx2".
    Returns:
        The variables to set (empty for "native").
    Raises:
        ValueError: an ISA other than those of ISAS.
    """
    if isa not in ISAS:
        raise ValueError(f"unknown instruction set {isa!r}: expected one of {', '.join(ISAS)}")
    if isa == "native":
        return {}
    return {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2", "PAGEDLLM_CPU_ENGINE": "avx2", "PAGEDLLM_LINEAR": "pagedllm", ISA_ENV: isa}


def emulate(isa: str) -> None:
    """Makes this process run under `isa`: returns at once where its variables are all set,
    else re-executes the same command line with them (never returns).

    Args:
        isa: one of ISAS.
    """
    env = isa_env(isa)
    if all(os.environ.get(k) == v for k, v in env.items()):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **env})


def check(isa: str) -> Dict[str, str]:
    """What this process runs, checked against `isa`.

    Args:
        isa: one of ISAS.
    Returns:
        torch's CPU capability, pagedllm's attention engine and its float32 linear backend.
    Raises:
        RuntimeError: an emulated run in which one of them is not held to the ISA.
    """
    import torch

    from pagedllm import _core
    from pagedllm.model import packed_linear

    got = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "pagedllm_cpu_engine": _core.get_cpu_engine(),
           "pagedllm_linear": str(packed_linear.choose_backend(torch.float32))}
    if isa == "avx2":
        want = {"torch_cpu_capability": "AVX2", "pagedllm_cpu_engine": "avx2",
                "pagedllm_linear": "pagedllm"}
        wrong = {k: v for k, v in got.items() if v != want[k]}
        if wrong:
            raise RuntimeError(f"the AVX2 emulation did not take: {wrong}, expected {want}")
    return got
