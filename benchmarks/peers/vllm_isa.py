"""vLLM's CPU kernels held to the instruction set of an emulated run (benchmarks/isa.py), and
which of its kernel libraries a run mapped.

vLLM picks its kernel library (vllm/_C for AVX512-BF16 CPUs, _C_AVX512, _C_AVX2) by torch's CPU
checks (vllm/platforms/cpu.py, import_kernels). In a run with PAGEDLLM_BENCH_ISA=avx2 they
answer "no AVX-512", so it loads _C_AVX2. Runs in vLLM's venv (beside the worker scripts); call
`hold_to_emulated_isa()` at a worker script's top level, not under `__main__`: vLLM spawns its
engine core, which runs the main script's top level again (as __mp_main__) before it imports
the kernels.
"""

from __future__ import annotations

import os

from worker_protocol import process_tree  # beside this file (stdlib only)


def hold_to_emulated_isa() -> None:
    """Makes torch report no AVX-512 in this process where PAGEDLLM_BENCH_ISA is avx2."""
    if os.environ.get("PAGEDLLM_BENCH_ISA") != "avx2":
        return
    import torch.cpu

    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False


def kernel_libraries(pid: int) -> list:
    """Names of vLLM's kernel libraries (vllm/_C*.so) mapped by pid and its descendants (the
    engine core vLLM spawns, its workers): which of _C, _C_AVX512 and _C_AVX2 a run used.

    Args:
        pid: the root process.
    Returns:
        The sorted file names, empty where none is mapped.
    """
    found = set()
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/maps") as f:
                found |= {os.path.basename(line.split()[-1]) for line in f if "/vllm/_C" in line}
        except OSError:  # a process that ended meanwhile
            continue
    return sorted(found)
