"""_core.rms_norm (the model's float32 RMSNorm on the CPU) against a float64 reference."""

import pytest
import torch

from pagedllm import _core


def reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.double()
    return w.double() * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("rows,cols", [(1, 8), (3, 13), (16, 1024), (70, 96), (300, 2048),
                                       (1000, 256)])
def test_matches_float64_reference(rows, cols):
    g = torch.Generator().manual_seed(rows * cols)
    x = torch.randn(rows, cols, generator=g) * 3
    w = torch.randn(cols, generator=g)
    out = torch.full_like(x, float("nan"))
    _core.rms_norm(out, x, w, 1e-5)
    assert torch.allclose(out.double(), reference(x, w, 1e-5), rtol=2e-6, atol=2e-6)


def test_in_place_and_strided_rows():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(40, 200, generator=g)
    x = base[:, :128]                     # rows 200 apart
    w = torch.randn(128, generator=g)
    expected = reference(x, w, 1e-6)
    tail = base[:, 128:].clone()
    _core.rms_norm(x, x, w, 1e-6)         # out aliases x
    assert torch.allclose(x.double(), expected, rtol=2e-6, atol=2e-6)
    assert torch.equal(base[:, 128:], tail)  # the rest of each row untouched


def test_zero_rows_and_zero_input():
    _core.rms_norm(torch.empty(0, 16), torch.empty(0, 16), torch.ones(16), 1e-5)
    out = torch.empty(2, 16)
    _core.rms_norm(out, torch.zeros(2, 16), torch.ones(16), 1e-5)
    assert torch.equal(out, torch.zeros(2, 16))  # eps keeps 0 / sqrt(0 + eps) finite


@pytest.mark.parametrize("args,match", [
    ((torch.empty(2, 8), torch.empty(2, 8, dtype=torch.float64), torch.ones(8), 1e-5),
     "x must be float32"),
    ((torch.empty(2, 8), torch.empty(2, 8), torch.ones(7), 1e-5), r"weight .* must be \[8\]"),
    ((torch.empty(3, 8), torch.empty(2, 8), torch.ones(8), 1e-5), "must have the shape of x"),
    ((torch.empty(2, 8), torch.empty(2, 8), torch.ones(8), -1.0), "eps must be finite and >= 0"),
    ((torch.empty(2, 8), torch.empty(8, 2).t(), torch.ones(8), 1e-5), "contiguous"),
    ((torch.empty(2, 8), torch.empty(8), torch.ones(8), 1e-5), "x must have 2 dimensions"),
])
def test_bad_arguments_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        _core.rms_norm(*args)
