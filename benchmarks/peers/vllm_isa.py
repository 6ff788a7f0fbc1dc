"""vLLM's CPU kernels held to the instruction set of an emulated run (benchmarks/isa.py).

vLLM picks its kernel library (vllm/_C for AVX512-BF16 CPUs, _C_AVX512, _C_AVX2) by torch's CPU
checks (vllm/platforms/cpu.py, import_kernels). In a run with PAGEDLLM_BENCH_ISA=avx2 they
answer "no AVX-512", so it loads _C_AVX2. Runs in vLLM's venv (beside the worker scripts); call
`hold_to_emulated_isa()` at a worker script's top level, not under `__main__`: vLLM spawns its
engine core, which runs the main script's top level again (as __mp_main__) before it imports
the kernels.
"""

from __future__ import annotations

import os


def hold_to_emulated_isa() -> None:
    """Makes torch report no AVX-512 in this process where PAGEDLLM_BENCH_ISA is avx2."""
    if os.environ.get("PAGEDLLM_BENCH_ISA") != "avx2":
        return
    import torch.cpu

    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
