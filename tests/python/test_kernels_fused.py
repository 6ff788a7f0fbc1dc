"""The fused element-wise kernels (residual add + RMSNorm, SiLU-and-mul, RoPE in place, the greedy
argmax) against float64 references and against the torch expressions they replace, on every CPU
engine this machine runs (each has its own row loops), float32 and bfloat16.

float32: within a few ulps of float64 (RoPE bit for bit equal to the torch expression, since it
has no sum to reorder). bfloat16: the torch expression's roundings, so equal to it up to one
bfloat16 ulp where float32 summation order (the norm) or exp's last bit (SiLU) tips a rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cpu_engines import ENGINES, restore, use_engine
from pagedllm import _core
from pagedllm.model.rope import RotaryEmbedding

DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(params=ENGINES)
def engine(request):
    use_engine(request.param)
    yield request.param
    restore()


def _randn(*shape, seed=0, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of b's bfloat16 ulp (float tensors)."""
    ulp = torch.finfo(torch.bfloat16).eps * b.abs().double().clamp_min(1e-30)
    return (a.double() - b.double()).abs() / ulp


def _norm64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.double()
    return w.double() * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)


def _torch_bf16_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


# --- residual add + RMSNorm --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 8), (3, 13), (16, 1024), (64, 256), (70, 96),
                                       (600, 256)])  # 600 x 256: split over the pool
def test_fused_add_rms_norm_matches_references(engine, dtype, rows, cols):
    x = _randn(rows, cols, seed=cols, scale=3, dtype=dtype)
    delta = _randn(rows, cols, seed=cols + 1, dtype=dtype)
    w = (1 + _randn(cols, seed=cols + 2, scale=0.1)).to(dtype)
    summed = x + delta                                         # torch's add, rounded to dtype
    out = torch.full_like(x, float("nan"))
    _core.set_num_threads(2)
    _core.fused_add_rms_norm(out, x, delta, w, 1e-5)
    assert torch.equal(x, summed)                              # the residual stream, in place
    if dtype == torch.float32:
        assert torch.allclose(out.double(), _norm64(summed, w, 1e-5), rtol=2e-6, atol=2e-6)
    else:
        assert _bf16_ulps(out, _torch_bf16_norm(summed, w, 1e-5)).max() <= 1.0
        assert torch.allclose(out.double(), _norm64(summed, w, 1e-5), rtol=2 ** -7, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_bf16_and_fp32_without_delta(engine, dtype):
    x = _randn(37, 200, seed=3, scale=2, dtype=dtype)
    w = _randn(200, seed=4, dtype=dtype)
    before = x.clone()
    out = torch.empty_like(x)
    _core.rms_norm(out, x, w, 1e-6)
    assert torch.equal(x, before)
    if dtype == torch.float32:
        assert torch.allclose(out.double(), _norm64(x, w, 1e-6), rtol=2e-6, atol=2e-6)
    else:
        assert _bf16_ulps(out, _torch_bf16_norm(x, w, 1e-6)).max() <= 1.0


def test_fused_add_rms_norm_strided_rows_leave_the_rest(engine):
    base = _randn(40, 300, seed=5)
    x = base[:, :128]                                         # rows 300 apart
    delta = _randn(40, 128, seed=6)
    w = _randn(128, seed=7)
    expected_x = x + delta
    tail = base[:, 128:].clone()
    out = torch.empty(40, 128)
    _core.fused_add_rms_norm(out, x, delta, w, 1e-5)
    assert torch.equal(base[:, :128], expected_x) and torch.equal(base[:, 128:], tail)
    assert torch.allclose(out.double(), _norm64(expected_x, w, 1e-5), rtol=2e-6, atol=2e-6)


# --- SiLU-and-mul --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,f", [(1, 1), (2, 7), (64, 688), (16, 2816), (5, 45), (100, 700)])
def test_silu_and_mul_matches_references(engine, dtype, rows, f):
    x = _randn(rows, 2 * f, seed=f, scale=4, dtype=dtype)
    out = torch.full((rows, f), float("nan"), dtype=dtype)
    _core.set_num_threads(2)
    _core.silu_and_mul(out, x)
    gate, up = x.double().chunk(2, dim=-1)
    ref = gate * torch.sigmoid(gate) * up
    if dtype == torch.float32:
        assert torch.allclose(out.double(), ref, rtol=1e-6, atol=1e-30)
    else:
        g, u = x.chunk(2, dim=-1)
        assert _bf16_ulps(out, F.silu(g) * u).max() <= 1.0    # torch's silu then mul, in bf16


def test_silu_and_mul_extremes(engine):
    gate = torch.tensor([[0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 88.0, -88.0, 89.0, -89.0, 100.0,
                          -100.0, 1e4, -1e4, float("inf"), float("-inf"), float("nan"), 3.0]])
    up = torch.ones_like(gate)
    up[0, -1] = float("nan")
    x = torch.cat([gate, up], dim=1)
    out = torch.empty_like(gate)
    _core.silu_and_mul(out, x)
    # torch's float32 expression (exp overflows to inf past 88.7, so silu(-89) is -0 there, as
    # here, where float64 would give -2e-37)
    ref = F.silu(gate) * up
    finite = torch.isfinite(ref)
    assert torch.allclose(out[finite], ref[finite], rtol=1e-6, atol=0)
    assert torch.equal(torch.signbit(out[finite]), torch.signbit(ref[finite]))
    assert torch.equal(torch.isnan(out), torch.isnan(ref))   # silu(-inf) * 1 is NaN in torch too
    assert torch.equal(torch.isinf(out), torch.isinf(ref))


# --- RoPE in place -----------------------------------------------------------------------------
def _tables(tokens, head_dim, dtype, seed):
    cos = _randn(tokens, 1, head_dim, seed=seed).to(dtype)
    sin = _randn(tokens, 1, head_dim, seed=seed + 1).to(dtype)
    return cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,head_dim", [(1, 1, 8), (3, 10, 32), (64, 10, 32),
                                                   (7, 3, 40), (16, 20, 64), (5, 4, 136),
                                                   (300, 20, 64)])
def test_rotary_matches_torch_expression_bit_for_bit(engine, dtype, tokens, heads, head_dim):
    kv = 2
    qkv = _randn(tokens, (heads + kv) * head_dim, seed=head_dim, dtype=dtype)
    qk = qkv[:, :heads * head_dim].view(tokens, heads, head_dim)  # token stride of qkv
    v_before = qkv[:, heads * head_dim:].clone()
    cos, sin = _tables(tokens, head_dim, dtype, seed=tokens)
    expected = RotaryEmbedding.apply(qk, cos, sin)              # the model's torch expression
    _core.set_num_threads(2)
    _core.rotary_embedding(qk, cos, sin)
    assert torch.equal(qk, expected)
    assert torch.equal(qkv[:, heads * head_dim:], v_before)     # v untouched


def test_rotary_against_float64_rotation(engine):
    tokens, heads, d = 9, 6, 64
    x = _randn(tokens, heads, d, seed=1)
    positions = torch.arange(tokens) * 37
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = positions[:, None].double() * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([-ang.sin(), ang.sin()], -1)[:, None, :]
    x1, x2 = x.double().chunk(2, dim=-1)
    ref = torch.cat([x1 * ang.cos()[:, None] - x2 * ang.sin()[:, None],
                     x2 * ang.cos()[:, None] + x1 * ang.sin()[:, None]], -1)
    y = x.clone()
    _core.rotary_embedding(y, cos.float(), sin.float().squeeze(1))  # [T, D] tables work too
    assert torch.allclose(y.double(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_on_a_transposed_head_major_tensor(engine, dtype):
    """[heads, tokens, head_dim] transposed to [tokens, heads, head_dim]: the token stride
    (head_dim) is below a token's heads, yet no two heads overlap; it used to be refused."""
    base = _randn(4, 5, 16, seed=3, dtype=dtype)          # [heads, tokens, head_dim]
    x = base.transpose(0, 1)                              # [tokens, heads, head_dim] view
    assert x.stride() == (16, 80, 1)
    cos, sin = _tables(5, 16, dtype, seed=4)
    expected = RotaryEmbedding.apply(x.contiguous(), cos, sin)
    _core.rotary_embedding(x, cos, sin)
    assert torch.equal(x, expected) and x.data_ptr() == base.data_ptr()
    y = torch.zeros(2, 3, 8).transpose(0, 1)              # the audit's case
    _core.rotary_embedding(y, torch.ones(3, 8), torch.zeros(3, 8))


def test_rotary_refuses_overlapping_heads():
    x = torch.zeros(32).as_strided((3, 2, 8), (4, 8, 1))  # token 1 starts inside token 0
    with pytest.raises(ValueError, match="x's token stride 4 overlaps the 8 elements inside it"):
        _core.rotary_embedding(x, torch.ones(3, 8), torch.zeros(3, 8))


def test_rotary_zero_tokens_and_heads(engine):
    _core.rotary_embedding(torch.empty(0, 4, 8), torch.empty(0, 1, 8), torch.empty(0, 1, 8))
    _core.rotary_embedding(torch.empty(2, 0, 8), torch.ones(2, 1, 8), torch.ones(2, 1, 8))


# --- greedy argmax -------------------------------------------------------------------------------
def _argmax_reference(rows):
    """First index of each row's maximum, in plain Python (NaN rows excluded by the caller)."""
    return [max(range(len(r)), key=lambda i: (r[i], -i)) for r in rows]


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 5), (64, 4096), (16, 32000), (7, 33)])
def test_argmax_rows_first_maximum(engine, rows, cols):
    x = _randn(rows, cols, seed=cols)
    x[0, cols // 2] = x[0].max() + 1                            # a known winner
    if cols > 3:
        x[-1, 1] = x[-1, 3] = x[-1].max() + 1                   # a tie: the first wins
    index = torch.empty(rows, dtype=torch.long)
    maxima = torch.empty(rows)
    _core.set_num_threads(2)
    assert _core.argmax_rows(x, index, maxima) == 0
    assert index.tolist() == _argmax_reference(x.tolist())
    assert torch.equal(maxima, x.max(dim=-1).values)
    assert _core.greedy_tokens(x) == index.tolist()  # the same, as a list


def test_argmax_rows_counts_rows_needing_the_exact_path(engine):
    lowest = torch.finfo(torch.float32).min
    x = torch.tensor([[1.0, 5.0, 5.0, 2.0],
                      [float("-inf"), float("-inf"), -3.0, float("-inf")],
                      [1.0, float("nan"), 7.0, 2.0],
                      [1.0, float("inf"), 7.0, 2.0],
                      [float("-inf")] * 4,
                      [float("-inf"), lowest, lowest, float("-inf")]])
    index = torch.empty(6, dtype=torch.long)
    maxima = torch.empty(6)
    assert _core.argmax_rows(x, index, maxima) == 4             # NaN, +inf, -inf, lowest rows
    assert index[:2].tolist() == [1, 2] and index[3] == 1 and index[4] == 0
    assert torch.isnan(maxima[2]) and maxima[3] == float("inf")
    assert _core.greedy_tokens(x) is None                       # some row needs the exact path
    assert _core.greedy_tokens(x[:2]) == [1, 2]
    assert _core.greedy_tokens(torch.empty(0, 4)) == []
    with pytest.raises(ValueError, match="float32"):
        _core.greedy_tokens(x.double())


# --- argument checks: a clear ValueError, nothing written ---------------------------------------
@pytest.mark.parametrize("call,match", [
    (lambda: _core.fused_add_rms_norm(torch.empty(2, 8), torch.zeros(2, 8),
                                      torch.zeros(2, 8, dtype=torch.bfloat16), torch.ones(8),
                                      1e-5), "delta is bfloat16.* but x is float32"),
    (lambda: _core.fused_add_rms_norm(torch.empty(2, 8), torch.zeros(2, 8), torch.zeros(3, 8),
                                      torch.ones(8), 1e-5), r"delta .* must have the shape of x"),
    (lambda: _core.rms_norm(torch.empty(2, 8, dtype=torch.float16),
                            torch.zeros(2, 8, dtype=torch.float16),
                            torch.ones(8, dtype=torch.float16), 1e-5),
     "x must be float32 or bfloat16"),
    (lambda: _core.silu_and_mul(torch.empty(2, 4), torch.zeros(2, 7)), r"\[rows, 2 \* f\]"),
    (lambda: _core.silu_and_mul(torch.empty(2, 5), torch.zeros(2, 8)),
     r"out .* must have the shape of half of x"),
    (lambda: _core.rotary_embedding(torch.zeros(2, 3, 7), torch.zeros(2, 1, 7),
                                    torch.zeros(2, 1, 7)), "head_dim must be even"),
    (lambda: _core.rotary_embedding(torch.zeros(2, 3, 8), torch.zeros(3, 1, 8),
                                    torch.zeros(2, 1, 8)), "cos .* must have 2 tokens"),
    (lambda: _core.rotary_embedding(torch.zeros(2, 3, 8), torch.zeros(2, 2, 8),
                                    torch.zeros(2, 2, 8)), r"\[num_tokens, 1, head_dim\]"),
    (lambda: _core.argmax_rows(torch.zeros(2, 0), torch.empty(2, dtype=torch.long),
                               torch.empty(2)), r"cols must be in \[1, 2\^31\)"),
    (lambda: _core.argmax_rows(torch.zeros(2, 4), torch.empty(2, dtype=torch.int32),
                               torch.empty(2)), "index must be int64"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_refused_call_writes_nothing():
    x = torch.ones(2, 8)
    delta = torch.ones(2, 8)
    out = torch.full((2, 8), 7.0)
    with pytest.raises(ValueError, match="eps must be finite"):
        _core.fused_add_rms_norm(out, x, delta, torch.ones(8), float("nan"))
    assert torch.equal(x, torch.ones(2, 8)) and torch.equal(out, torch.full((2, 8), 7.0))


# --- pagedllm.ops: the kernels on CPU float32 / bfloat16, the torch expressions otherwise -------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # float16: the torch fallback
def test_ops_wrappers_agree_with_the_torch_expressions(dtype):
    from pagedllm import ops

    x = _randn(6, 64, seed=1, dtype=dtype)
    delta = _randn(6, 64, seed=2, dtype=dtype)
    w = _randn(64, seed=3, dtype=dtype)
    expected_x = x + delta
    out = torch.empty_like(x)
    ops.fused_add_rms_norm(out, x, delta, w, 1e-5)
    assert torch.equal(x, expected_x)
    ref = _norm64(expected_x, w, 1e-5)
    tol = 2e-6 if dtype == torch.float32 else 4e-3
    assert torch.allclose(out.double(), ref, rtol=tol, atol=tol)

    gate_up = _randn(6, 2 * 48, seed=4, scale=3, dtype=dtype)
    act = torch.empty(6, 48, dtype=dtype)
    ops.silu_and_mul(act, gate_up)
    g, u = gate_up.chunk(2, dim=-1)
    assert torch.allclose(act.double(), (F.silu(g.float()) * u.float()).double(), rtol=tol,
                          atol=tol)

    qk = _randn(6, 5, 16, seed=5, dtype=dtype)
    cos, sin = _tables(6, 16, dtype, seed=6)
    expected = RotaryEmbedding.apply(qk, cos, sin)
    ops.rotary_embedding(qk, cos, sin)
    assert torch.equal(qk, expected)
