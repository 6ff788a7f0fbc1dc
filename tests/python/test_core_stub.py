"""python/pagedllm/_core.pyi declares what the extension module defines: the same public
functions, classes and constants, and each class's public methods and properties."""

import ast
from pathlib import Path

import pytest

from pagedllm import _core

STUB = Path(__file__).resolve().parents[2] / "python" / "pagedllm" / "_core.pyi"
# Names only the stub has: type aliases for annotations.
STUB_ONLY = {"IntArray", "Tensor"}
# The CUDA submodule exists only in CUDA builds and has no stub here.
MODULE_ONLY = {"cuda"}


def _stub_names():
    tree = ast.parse(STUB.read_text())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in top if not n.startswith("_")} - STUB_ONLY, classes


def _public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stub_declares_every_public_name_of_the_module():
    stub, _ = _stub_names()
    module = _public(_core) - MODULE_ONLY
    assert sorted(module - stub) == [], "in _core but not in _core.pyi"
    # A kernel-less build lacks the kernels; every stub name must exist otherwise.
    missing = stub - module
    if hasattr(_core, "paged_attention_decode"):
        assert sorted(missing) == [], "in _core.pyi but not in _core"


@pytest.mark.parametrize("name", ["BlockAllocator", "BlockStore", "KVCacheManager",
                                  "DecoderWeights"])
def test_stub_declares_every_public_member_of_each_class(name):
    if not hasattr(_core, name):
        pytest.skip(f"{name} is not in this build (kernel-less)")
    _, classes = _stub_names()
    declared = {n for n in classes[name] if not n.startswith("_")}
    assert sorted(_public(getattr(_core, name)) - declared) == []
    assert sorted(declared - _public(getattr(_core, name))) == []
