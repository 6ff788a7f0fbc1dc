"""Prepacked linear layers (pagedllm's panels and oneDNN's blocked layout) against a float64
reference, on every CPU engine that runs here, and their contract."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm import _core
from pagedllm.model import packed_linear

ONEDNN = pytest.mark.skipif(not packed_linear.onednn_available(),
                            reason="torch built without oneDNN")
BACKENDS = [pytest.param("pagedllm"), pytest.param("onednn", marks=ONEDNN)]


@pytest.fixture(params=_core.cpu_engines())
def engine(request):
    """Each CPU engine this machine runs in turn (the linear tiles follow the engine choice)."""
    _core.set_cpu_engine(request.param)
    yield request.param
    _core.set_cpu_engine("auto")


def bound(x, w, b, dtype):
    """|y - y64| allowed: the float32 sums' error, plus half a bf16 ulp of the output."""
    mag = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    sums = (x.shape[1] + 2) * 2.0 ** -24 * mag
    if dtype == torch.bfloat16:
        ref = F.linear(x.double(), w.double(), None if b is None else b.double())
        return sums + 2.0 ** -8 * (ref.abs() + sums)
    return sums + 1e-30


@pytest.mark.parametrize("rows", [1, 3, 6, 7, 16, 17, 70, 300])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pagedllm_matches_float64_on_every_engine(engine, rows, bias, dtype):
    g = torch.Generator().manual_seed(rows)
    w = (torch.randn(100, 83, generator=g) * 0.1).to(dtype)  # a partial last panel, odd K
    b = torch.randn(100, generator=g).to(dtype) if bias else None
    x = torch.randn(rows, 83, generator=g).to(dtype)
    y = packed_linear.linear(x, packed_linear.pack(w, "pagedllm"), b)
    assert y.shape == (rows, 100) and y.dtype == dtype and y.is_contiguous()
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    err = (y.double() - ref).abs()
    assert (err <= bound(x, w, b, dtype)).all(), (engine, err.max().item())


def test_pagedllm_kernel_follows_the_engine():
    fp32 = {"generic": "generic", "avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512"}
    has_bf16 = "avx512bf16" in _core.build_info()["cpu_features"]
    try:
        for e in _core.cpu_engines():
            _core.set_cpu_engine(e)
            assert _core.linear_kernel("float32") == fp32[e]
            bf16 = _core.linear_kernel("bfloat16")
            if e.startswith("avx512"):
                assert bf16 == ("avx512_bf16" if has_bf16 else "avx2")
            else:
                assert bf16 == e
    finally:
        _core.set_cpu_engine("auto")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 70, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_reference(backend, rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 80, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 80, generator=g)
    y = packed_linear.linear(x, packed_linear.pack(w, backend), b)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert y.shape == (rows, 96) and y.dtype == torch.float32 and y.is_contiguous()
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_matches_the_float_product(backend):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 48, generator=g).bfloat16()
    x = torch.randn(5, 48, generator=g).bfloat16()
    y = packed_linear.linear(x, packed_linear.pack(w, backend), None)
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)


def test_backends_agree_on_a_model_sized_product():
    if not packed_linear.onednn_available():
        pytest.skip("torch built without oneDNN")
    g = torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.bfloat16):
        w = (torch.randn(1536, 1024, generator=g) * 0.03).to(dtype)
        x = torch.randn(16, 1024, generator=g).to(dtype)
        a = packed_linear.linear(x, packed_linear.pack(w, "pagedllm"), None).double()
        b = packed_linear.linear(x, packed_linear.pack(w, "onednn"), None).double()
        tol = 2e-5 if dtype == torch.float32 else 2.0 ** -7
        assert ((a - b).abs() <= tol * (a.abs() + 1)).all()


def test_strided_and_non_contiguous_rows():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(40, 32, generator=g)
    packed = packed_linear.pack(w, "pagedllm")
    big = torch.randn(10, 64, generator=g)
    x = big[:, :32]  # row stride 64
    assert torch.allclose(packed_linear.linear(x, packed, None), x @ w.T, rtol=1e-5, atol=1e-5)
    xt = torch.randn(32, 6, generator=g).T  # column-major rows: copied first
    assert torch.allclose(packed_linear.linear(xt, packed, None), xt @ w.T, rtol=1e-5, atol=1e-5)


def test_pagedllm_rejects_mismatched_inputs():
    packed = packed_linear.pack(torch.randn(16, 8), "pagedllm")
    with pytest.raises(ValueError, match="packed .* must hold"):
        packed_linear.linear(torch.randn(2, 9), packed, None)  # in_features 9, packed for 8
    with pytest.raises(ValueError, match="is bfloat16"):
        packed_linear.linear(torch.randn(2, 8).bfloat16(), packed, None)
    with pytest.raises(ValueError, match="bias"):
        packed_linear.linear(torch.randn(2, 8), packed, torch.randn(15))
    y = torch.full((2, 16), 5.0)
    with pytest.raises(ValueError, match="overlap"):
        _core.linear(y, y[:, :8], packed.data, None)
    assert (y == 5.0).all()


def test_choose_backend(monkeypatch):
    monkeypatch.delenv(packed_linear.BACKEND_ENV, raising=False)
    engines, features = _core.cpu_engines(), _core.build_info()["cpu_features"]
    for dtype in (torch.float32, torch.bfloat16):
        if "amx_bf16" in features and dtype == torch.bfloat16:  # oneDNN's AMX GEMMs
            own = False
        elif "avx512" in engines:  # AVX-512: float32 always, bfloat16 with AVX512_BF16
            own = dtype == torch.float32 or "avx512_bf16" in engines
        else:  # AVX2-only: both dtypes on the AVX2 tiles
            own = "avx2" in engines
        want = "pagedllm" if own else ("onednn" if packed_linear.onednn_available(dtype) else None)
        assert packed_linear.choose_backend(dtype) == want
    monkeypatch.setenv(packed_linear.BACKEND_ENV, "pagedllm")
    assert packed_linear.choose_backend(torch.float32) == "pagedllm"
    assert packed_linear.pack(torch.ones(4, 8)).backend == "pagedllm"
    monkeypatch.setenv(packed_linear.BACKEND_ENV, "cublas")
    with pytest.raises(ValueError, match="PAGEDLLM_LINEAR='cublas': expected auto"):
        packed_linear.choose_backend(torch.float32)


class _FakeCore:
    """What choose_backend reads of pagedllm._core, for a CPU this machine is not."""

    def __init__(self, engines, features):
        self.engines, self.features = engines, features

    def cpu_engines(self):
        return list(self.engines)

    def build_info(self):
        return {"cpu_kernels_compiled": ["generic", "avx2", "avx512", "avx512_bf16"],
                "cpu_features": list(self.features)}


ZEN4 = (("avx512_bf16", "avx512", "avx2", "generic"), ("avx2", "fma", "avx512f", "avx512bf16"))
CASCADE_LAKE = (("avx512", "avx2", "generic"), ("avx2", "fma", "avx512f"))
SAPPHIRE_RAPIDS = (("avx512_bf16", "avx512", "avx2", "generic"),
                   ("avx2", "fma", "avx512f", "avx512bf16", "amx_bf16"))
ZEN3 = (("avx2", "generic"), ("avx2", "fma"))
OLD_X86 = (("generic",), ())


@pytest.mark.parametrize("cpu,onednn,want_f32,want_bf16", [
    (ZEN4, (True, True), "pagedllm", "pagedllm"),
    (CASCADE_LAKE, (True, True), "pagedllm", "onednn"),  # bf16 without AVX512_BF16: oneDNN's
    (SAPPHIRE_RAPIDS, (True, True), "pagedllm", "onednn"),  # AMX: oneDNN's bf16 GEMMs on it
    (ZEN3, (True, False), "pagedllm", "pagedllm"),  # AVX2-only: oneDNN has no bf16 GEMM there
    (OLD_X86, (True, False), "onednn", None),  # no vector tiles: oneDNN where it runs
], ids=["zen4", "cascade_lake", "sapphire_rapids", "zen3_avx2", "no_avx2"])
def test_choose_backend_by_cpu(monkeypatch, cpu, onednn, want_f32, want_bf16):
    monkeypatch.delenv(packed_linear.BACKEND_ENV, raising=False)
    monkeypatch.setattr(packed_linear, "_CORE", _FakeCore(*cpu))
    runs = {torch.float32: onednn[0], torch.bfloat16: onednn[1]}
    monkeypatch.setattr(packed_linear, "onednn_available", lambda dtype=torch.float32: runs[dtype])
    for cached in (packed_linear.pagedllm_vectorised, packed_linear._has_amx):
        cached.cache_clear()
    try:
        assert packed_linear.choose_backend(torch.float32) == want_f32
        assert packed_linear.choose_backend(torch.bfloat16) == want_bf16
        if not onednn[1]:
            monkeypatch.setenv(packed_linear.BACKEND_ENV, "onednn")
            with pytest.raises(ValueError, match="no prepacked oneDNN linear for bfloat16"):
                packed_linear.choose_backend(torch.bfloat16)
    finally:
        monkeypatch.undo()
        for cached in (packed_linear.pagedllm_vectorised, packed_linear._has_amx):
            cached.cache_clear()


def test_onednn_available_checks_each_dtype():
    if not packed_linear.onednn_available():
        pytest.skip("torch built without oneDNN")
    for dtype in (torch.float32, torch.bfloat16):
        w = torch.randn(32, 64).to(dtype)
        x = torch.randn(2, 64).to(dtype)
        if packed_linear.onednn_available(dtype):  # yes: that dtype packs and multiplies right
            y = packed_linear.linear(x, packed_linear.pack(w, "onednn"), None)
            assert torch.allclose(y.float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2)
        else:  # no (bf16 on an AVX2-only CPU): packing for oneDNN fails there
            with pytest.raises(RuntimeError):
                packed_linear.linear(x, packed_linear.pack(w, "onednn"), None)
    assert not packed_linear.onednn_available(torch.float16)


def test_row_buckets_are_few_and_tight():
    buckets = {packed_linear.padded_rows(n) for n in range(1, 4097)}
    assert len(buckets) <= 16 + 8 * 8  # exact to 16, then 8 per octave
    for n in range(1, 4097):
        p = packed_linear.padded_rows(n)
        assert n <= p and (p == n if n <= 16 else p - n < n / 8)
        assert packed_linear.padded_rows(p) == p


def test_small_weights_stay_strided():
    assert not packed_linear.worth_packing(torch.empty(128, 256))
    assert packed_linear.worth_packing(torch.empty(256, 256))
    assert packed_linear.worth_packing(torch.empty(1024, 1024))


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_rows(backend):
    y = packed_linear.linear(torch.empty(0, 8), packed_linear.pack(torch.ones(4, 8), backend), None)
    assert y.shape == (0, 4)


@pytest.mark.parametrize("weight", [torch.ones(4), torch.ones(2, 3, dtype=torch.float64),
                                    torch.ones(2, 3, dtype=torch.float16)])
def test_rejects_what_it_cannot_pack(weight):
    with pytest.raises(ValueError, match="expected a 2-D float32 or bfloat16 CPU tensor"):
        packed_linear.pack(weight)


def test_rejects_an_unknown_backend():
    with pytest.raises(ValueError, match="linear backend 'mkl'"):
        packed_linear.pack(torch.ones(2, 3), "mkl")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tied", [False, True])
def test_prepack_releases_the_strided_weight(tmp_path, tied, backend, monkeypatch):
    from pagedllm.model import load_model, write_random_checkpoint
    from pagedllm.model.checkpoint import PRESETS

    monkeypatch.setattr(packed_linear, "MIN_PACKED_ELEMENTS", 0)
    monkeypatch.setenv(packed_linear.BACKEND_ENV, backend)
    write_random_checkpoint(tmp_path, {**PRESETS["tiny"], "tie_word_embeddings": tied}, seed=3)
    plain, _ = load_model(tmp_path)
    packed, _ = load_model(tmp_path, prepack=True)
    names = {n for n, _ in packed.named_parameters()}
    assert not any(n.endswith("proj.weight") or n == "lm_head.weight" for n in names)
    # A tied embedding is packed in pagedllm's layout (it serves the lookup too) unless oneDNN
    # is asked for everywhere; an untied one stays strided.
    tied_packed = tied and backend == "pagedllm"
    assert ("embed_tokens.weight" in names) == (not tied_packed)
    assert all(m.packed.backend == backend for m in packed.modules()
               if getattr(m, "packed", None) is not None)
    if tied and not tied_packed:
        assert packed.lm_head is None and packed.lm_head_weight is packed.embed_tokens.weight
    else:
        with pytest.raises(RuntimeError, match="prepacked"):
            packed.lm_head_weight
    h = torch.randn(3, plain.config.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(packed.compute_logits(h), plain.compute_logits(h), rtol=1e-5, atol=1e-5)
    ids = torch.tensor([0, 5, 17, plain.config.vocab_size - 1, 5])
    assert torch.equal(packed.embed_tokens(ids), plain.embed_tokens(ids))  # bit-identical rows
    packed_count = sum(1 for m in packed.modules() if getattr(m, "packed", None) is not None)
    assert packed.prepack_weights() == packed_count  # packing twice changes nothing


def test_prepack_leaves_small_weights(tmp_path):
    from pagedllm.model import load_model, write_random_checkpoint
    from pagedllm.model.checkpoint import PRESETS

    # hidden 64, vocab 512: every weight under MIN_PACKED_ELEMENTS
    small = {"hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512}
    write_random_checkpoint(tmp_path, {**PRESETS["tiny"], **small}, seed=3)
    model, _ = load_model(tmp_path, prepack=True)
    assert model.prepack_weights() == 0
    assert all(getattr(m, "packed", None) is None for m in model.modules())
    assert any(n.endswith("proj.weight") for n, _ in model.named_parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features, in_features", [(16, 8), (37, 5), (130, 33), (1, 1)])
def test_gather_rows_returns_the_weights_rows(dtype, out_features, in_features):
    # partial last panels, odd K (bf16 pads the last pair), one row: the rows are bit-identical
    g = torch.Generator().manual_seed(out_features)
    w = torch.randn(out_features, in_features, generator=g).to(dtype)
    packed = packed_linear.pack(w, "pagedllm")
    ids = torch.randint(0, out_features, (50,), generator=g)
    assert torch.equal(packed_linear.gather_rows(packed, ids), w[ids])
    assert torch.equal(packed_linear.gather_rows(packed, torch.arange(out_features)), w)
    assert packed_linear.gather_rows(packed, ids[:0]).shape == (0, in_features)


def test_gather_rows_rejects_bad_ids_and_opaque_layouts():
    packed = packed_linear.pack(torch.randn(20, 8), "pagedllm")
    for bad in (torch.tensor([0, 20]), torch.tensor([-1])):
        with pytest.raises(IndexError, match=r"expected ids in \[0, 20\)"):
            packed_linear.gather_rows(packed, bad)
    with pytest.raises(ValueError, match="1-D"):
        packed_linear.gather_rows(packed, torch.zeros(2, 2, dtype=torch.long))
    if packed_linear.onednn_available():
        with pytest.raises(ValueError, match="opaque"):
            packed_linear.gather_rows(packed_linear.pack(torch.randn(20, 8), "onednn"),
                                      torch.tensor([1]))


def test_tied_backend(monkeypatch):
    monkeypatch.delenv(packed_linear.BACKEND_ENV, raising=False)
    vector = bool({"avx512", "avx2"} & set(_core.cpu_engines()))
    assert packed_linear.tied_backend(torch.float32) == ("pagedllm" if vector else None)
    assert packed_linear.tied_backend(torch.float16) is None
    monkeypatch.setenv(packed_linear.BACKEND_ENV, "onednn")
    assert packed_linear.tied_backend(torch.float32) is None
    monkeypatch.setenv(packed_linear.BACKEND_ENV, "mkl")  # read as choose_backend reads it
    with pytest.raises(ValueError, match="PAGEDLLM_LINEAR='mkl'"):
        packed_linear.tied_backend(torch.float32)
