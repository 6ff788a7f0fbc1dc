"""The pytest fixtures the CUDA kernel tests share (test_cuda_kernels.py,
test_cuda_cross_attention.py): import them by name into a test module to use them."""

from __future__ import annotations

import pytest
import torch

from cuda_harness import Backend
from pagedllm import _core

CUDA = getattr(_core, "cuda", None)  # pagedllm._core.cuda, or None when built without nvcc


@pytest.fixture(autouse=True)
def stop_if_the_context_breaks(request):
    """A kernel fault leaves the CUDA context unusable for every later test: stop the run at
    the first one, naming the test that broke it."""
    yield
    if "gpu" in request.keywords and torch.cuda.is_available():
        try:
            torch.cuda.synchronize()
        except RuntimeError as e:  # pragma: no cover - only on a kernel fault
            pytest.exit(f"the CUDA context broke during {request.node.nodeid}: {e}", returncode=3)


@pytest.fixture
def cuda_backend():
    """The CUDA kernels on the GPU (skips the test when built without CUDA)."""
    if CUDA is None:
        pytest.skip("built without CUDA")
    return Backend(CUDA, "cuda")
