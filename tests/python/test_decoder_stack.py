"""The decoder stack (`_core.decoder_stack`, model/decoder_stack.py): the CPU step's layers in one
call give the Python layers' outputs bit for bit, serve only the steps they can, and refuse bad
input without writing."""

import pytest
import torch

from cpu_engines import ENGINES, OPT_IN_ENGINES, restore, use_engine
from model_fixtures import PagedRunner, blocks_needed, prefill_meta, torch_one_thread  # noqa: F401
from pagedllm import _core
from pagedllm.model import load_model, write_random_checkpoint
from pagedllm.model.decoder_stack import DecoderStack

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# Every projection >= packed_linear.MIN_PACKED_ELEMENTS, so all are packed and the stack serves.
SHAPE = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=384, vocab_size=256)
PROMPTS = [[(7 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate((1, 5, 17, 40, 70))]


@pytest.fixture
def pagedllm_linear(monkeypatch):
    """Packs for pagedllm's GEMM whatever this CPU is (the stack serves only those weights)."""
    monkeypatch.setenv("PAGEDLLM_LINEAR", "pagedllm")


def _load(path, dtype=torch.float32, **overrides):
    write_random_checkpoint(path, dict(SHAPE, **overrides), seed=3)
    return load_model(path, dtype=dtype, prepack=True)


def _run(model, config, use_stack, kv_cache_dtype="auto", chunk_size=None):
    model._stack = False if use_stack else None  # False: built at the first step
    runner = PagedRunner(model, config, 16, blocks_needed(PROMPTS, 6, 16) + 2, kv_cache_dtype)
    result = runner.generate(PROMPTS, 6, chunk_size=chunk_size)
    assert isinstance(model._stack, DecoderStack) == use_stack
    return result, runner


@pytest.mark.parametrize("dtype,kv_cache_dtype,bias", [
    (torch.float32, "auto", False), (torch.float32, "fp8", False), (torch.float32, "bf16", True),
    (torch.bfloat16, "auto", False), (torch.bfloat16, "fp8", True)])
@pytest.mark.parametrize("chunk_size", [None, 24])
def test_stack_matches_the_python_layers_bit_for_bit(tmp_path, pagedllm_linear, dtype,
                                                     kv_cache_dtype, bias, chunk_size):
    model, config = _load(tmp_path, dtype, attention_bias=bias, mlp_bias=bias)
    python, py_runner = _run(model, config, False, kv_cache_dtype, chunk_size)
    stack, st_runner = _run(model, config, True, kv_cache_dtype, chunk_size)
    if chunk_size:
        assert st_runner.mixed_steps > 0  # decode and prefill rows in one step
    assert python.tokens == stack.tokens
    for a, b in zip(python.logits, stack.logits):
        assert torch.equal(a, b)
    for layer in range(config.num_hidden_layers):  # the same bytes in the caches
        assert torch.equal(py_runner.kv.key_cache(layer), st_runner.kv.key_cache(layer))
        assert torch.equal(py_runner.kv.value_cache(layer), st_runner.kv.value_cache(layer))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tied_embedding_is_read_from_the_lm_heads_panels(tmp_path, pagedllm_linear, dtype):
    # the stack's inputs come from the packed tied matrix (`_core.token_rows`, packed=True)
    model, config = _load(tmp_path, dtype, tie_word_embeddings=True)
    assert model.embed_tokens.packed is not None and model.embed_tokens.weight is None
    python, _ = _run(model, config, False, chunk_size=24)
    stack, _ = _run(model, config, True, chunk_size=24)
    assert python.tokens == stack.tokens
    for a, b in zip(python.logits, stack.logits):
        assert torch.equal(a, b)


def test_stack_inputs_grow_the_rope_tables_past_their_rows(tmp_path, pagedllm_linear):
    model, _ = _load(tmp_path, max_position_embeddings=8192)
    for positions in ([0, 5], [3000, 7], [8191], [9000]):  # the tables start at 1,024 rows
        ids, pos = torch.tensor([3, 250][:len(positions)]), torch.tensor(positions)
        x, cos, sin = model._token_rows(ids, pos)
        want_cos, want_sin = model.rotary.tables(pos)
        assert torch.equal(x, model.embed_tokens(ids))
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    with pytest.raises(IndexError, match="embedding id 256"):
        model._token_rows(torch.tensor([256]), torch.tensor([0]))


@pytest.mark.parametrize("engine", ENGINES + OPT_IN_ENGINES)
def test_every_cpu_engine(tmp_path, pagedllm_linear, engine):
    use_engine(engine)
    try:
        model, config = _load(tmp_path)
        python, _ = _run(model, config, False, chunk_size=24)
        stack, _ = _run(model, config, True, chunk_size=24)
    finally:
        restore()
    for a, b in zip(python.logits, stack.logits):
        assert torch.equal(a, b)


def test_off_switch_and_models_it_does_not_serve(tmp_path, pagedllm_linear, monkeypatch):
    model, config = _load(tmp_path / "a")
    assert model.build_decoder_stack() is not None
    # off for a model made and packed while PAGEDLLM_DECODER_STACK=0, whatever it says later
    monkeypatch.setenv("PAGEDLLM_DECODER_STACK", "0")
    off, _ = load_model(tmp_path / "a", prepack=True)
    monkeypatch.delenv("PAGEDLLM_DECODER_STACK")
    runner = PagedRunner(off, config, 16, 8)
    runner.generate(PROMPTS[:2], 2)
    assert off._stack is None
    # a projection left strided (not packed): the Python layers serve
    write_random_checkpoint(tmp_path / "b", dict(SHAPE, hidden_size=128, intermediate_size=192))
    small, _ = load_model(tmp_path / "b", prepack=True)
    assert small.build_decoder_stack() is None
    # unpacked weights: none
    plain, _ = load_model(tmp_path / "a", prepack=False)
    assert plain.build_decoder_stack() is None


def test_observer_steps_take_the_python_layers(tmp_path, pagedllm_linear):
    model, config = _load(tmp_path)
    seen = []

    class Observer:
        def before_layer(self, i):
            seen.append(("before", i))

        def after_layer(self, i, x):
            seen.append(("after", i))

    runner = PagedRunner(model, config, 16, 8)
    ids = torch.tensor(PROMPTS[2])
    model(ids, torch.arange(len(ids)), prefill_meta(len(ids)), runner.kv, observer=Observer())
    assert ("after", config.num_hidden_layers - 1) in seen


def test_bad_input_is_refused_before_anything_is_written(tmp_path, pagedllm_linear):
    model, config = _load(tmp_path)
    stack = model.build_decoder_stack()
    runner = PagedRunner(model, config, 16, 4)
    n = 20
    x = torch.randn(n, config.hidden_size)
    cos, sin = model.rotary.tables(torch.arange(n))
    meta = prefill_meta(n)
    layers = range(config.num_hidden_layers)
    keys = [runner.kv.key_cache(i) for i in layers]
    values = [runner.kv.value_cache(i) for i in layers]
    ws = torch.empty(stack.weights.workspace_bytes(n), dtype=torch.uint8)
    args = dict(weights=stack.weights, out=torch.empty_like(x), x=x, cos=cos, sin=sin,
                slot_mapping=meta.slot_mapping, block_tables=meta.block_tables,
                context_lens=meta.context_lens, cu_seqlens_q=meta.cu_seqlens_q,
                num_decode_seqs=0, key_caches=keys, value_caches=values, kv_cache_dtype="auto",
                k_scale=1.0, v_scale=1.0, eps=1e-5, scale=0.17, workspace=ws)
    x0 = x.clone()
    bad = [
        (dict(workspace=ws[:100]), "workspace"),
        (dict(key_caches=keys[:1]), "caches"),
        (dict(x=x[:, :100].contiguous(), out=torch.empty(n, 100)), "x"),
        (dict(cos=cos[:5]), "cos"),
        (dict(num_decode_seqs=1), "cu_seqlens_q"),
        (dict(x=x.double(), out=torch.empty_like(x).double()), "x"),
        (dict(block_tables=meta.block_tables.long()), "block_tables must be int32"),
    ]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            _core.decoder_stack(**dict(args, **change))
        assert torch.equal(x, x0) and all(bool((k == 0).all()) for k in keys)
    # a block id outside the pool: the cache write of layer 0 refuses it, x is untouched
    with pytest.raises((ValueError, IndexError)):
        _core.decoder_stack(**dict(args, block_tables=torch.tensor([[0, 99]], dtype=torch.int32),
                                   slot_mapping=torch.arange(n, dtype=torch.int64) + 99 * 16))
    assert all(bool((k == 0).all()) for k in keys)
    # the same call with good input runs, and writes the 20 tokens' keys
    _core.decoder_stack(**args)
    assert bool(keys[0][0].abs().sum(-1).gt(0).all())


def test_weights_are_checked_once_at_build(tmp_path, pagedllm_linear):
    model, config = _load(tmp_path)
    layer = model.layers[0]
    w = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
         layer.self_attn.qkv_proj.packed.data, None, layer.self_attn.o_proj.packed.data, None,
         layer.mlp.gate_up_proj.packed.data, None, layer.mlp.down_proj.packed.data, None]
    sizes = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
             config.head_dim, config.intermediate_size)
    assert _core.DecoderWeights([tuple(w)], model.norm.weight, *sizes).num_layers == 1
    with pytest.raises(ValueError, match="10-tuple"):
        _core.DecoderWeights([tuple(w[:9])], model.norm.weight, *sizes)
    swapped = list(w)
    swapped[2], swapped[4] = w[4], w[2]  # qkv and o exchanged: wrong packed sizes
    with pytest.raises(ValueError, match="packed"):
        _core.DecoderWeights([tuple(swapped)], model.norm.weight, *sizes)
    with pytest.raises(ValueError, match="multiple"):
        _core.DecoderWeights([tuple(w)], model.norm.weight, 256, 8, 3, 32, 384)
    mixed = list(w)
    mixed[0] = w[0].bfloat16()
    with pytest.raises(ValueError, match="float32|bfloat16"):
        _core.DecoderWeights([tuple(mixed)], model.norm.weight, *sizes)
