"""Shared pytest configuration for pagedllm's Python tests."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    """Skip GPU tests cleanly on machines without a CUDA device."""
    try:
        from pagedllm import _core

        gpus = _core.build_info()["gpu_count"]
    except ImportError:
        gpus = 0
    if gpus > 0 and os.environ.get("PAGEDLLM_SKIP_GPU") != "1":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
