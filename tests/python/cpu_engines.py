"""The CPU attention engines, for tests that run once per engine.

ENGINES lists every exact engine pagedllm can compile, best first (the float64-reference tests
with the exact engines' error bound run on each); OPT_IN_ENGINES the ones "auto" picks only
for decode of a bf16 query on an fp8 cache, because they round the query and probabilities to
bf16 (tested at their own bound in test_kernels_bf16_engine.py; auto's choice in
test_kernels_auto_engine.py). use_engine(name) makes the kernel calls use it, or skips the test
with the reason it cannot run here (not compiled for this platform, or this CPU lacks its
instructions); restore() goes back to the default choice.
"""

from __future__ import annotations

import pytest

from pagedllm import _core

ENGINES = ["avx512", "avx2", "generic"]
OPT_IN_ENGINES = ["avx512_bf16"]


def use_engine(name: str) -> None:
    """Forces engine `name` for the following kernel calls, or skips the test."""
    if name not in _core.build_info()["cpu_kernels_compiled"]:
        pytest.skip(f"the {name} engine is not compiled on this platform")
    if name not in _core.cpu_engines():
        pytest.skip(f"this CPU lacks the instructions of the {name} engine")
    _core.set_cpu_engine(name)
    assert _core.get_cpu_engine() == name


def restore() -> None:
    """Back to the best engine this CPU runs."""
    _core.set_cpu_engine("auto")
