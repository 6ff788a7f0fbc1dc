"""fp16 / bf16 / fp8 KV storage at the model level.

Exact semantics, checked in every attention call of a whole run (chunked prefill + decode): the
cache holds the new keys/values rounded exactly as torch's own casts round them (float16,
bfloat16, float8_e4m3fn, float8_e5m2 of x / scale), and the attention output equals fp32
attention over that decoded cache. (End to end, two runs cannot be compared exactly: fp8
rounding is discontinuous, so an fp32 summation-order difference in one layer can move a key
across a rounding boundary in the next.)
Quality is measured by benchmarks/bench_kv_dtypes.py (docs/BENCHMARKS.md); end to end only a
sanity bound on the logprob error against fp32 storage is asserted.
"""

import pytest
import torch

import pagedllm.model.llama as llama
from model_fixtures import PagedRunner, blocks_needed, make_prompts
from model_fixtures import torch_one_thread  # noqa: F401  (fixture)
from pagedllm.model import load_model, write_random_checkpoint

pytestmark = pytest.mark.usefixtures("torch_one_thread")

STORAGE = {"fp16": torch.float16, "bf16": torch.bfloat16,
           "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# sanity bound on max |logprob - logprob with fp32 storage| (measured: see BENCHMARKS.md)
LOGPROB_SANITY = {"fp16": 0.05, "bf16": 0.5, "fp8_e4m3": 2.0, "fp8_e5m2": 4.0}
STEPS = 17
LENGTHS = (1, 7, 16, 30, 45, 64)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("kvdt")
    write_random_checkpoint(path, dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=256,
                                       vocab_size=512, initializer_range=0.1), seed=5)
    model, config = load_model(path)
    prompts = make_prompts(config.vocab_size, LENGTHS, seed=2)
    fp32 = _runner(model, config, prompts, "auto").generate(prompts, STEPS, chunk_size=11)
    return model, config, prompts, fp32


def _runner(model, config, prompts, kv_dtype, scale=1.0):
    runner = PagedRunner(model, config, 16, blocks_needed(prompts, STEPS, 16), kv_cache_dtype=kv_dtype)
    runner.kv.k_scale, runner.kv.v_scale = scale, 2 * scale
    return runner


def _decode(cache, fmt, scale):
    # stored cache -> float32 values
    if fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
        return cache.view(fmt).float() * scale
    return cache.float()


@pytest.mark.parametrize("kv_dtype, scale", [(d, 1.0) for d in sorted(STORAGE)]
                         + [("fp8_e4m3", 0.25), ("fp8_e5m2", 4.0)])
def test_every_attention_call_rounds_like_torch(setup, kv_dtype, scale, monkeypatch):
    model, config, prompts, fp32 = setup
    fmt = STORAGE[kv_dtype]
    fp8 = kv_dtype.startswith("fp8")
    ks, vs = (scale, 2 * scale) if fp8 else (1.0, 1.0)
    exact_attention = llama.paged_attention
    calls = []

    def checked(q, k, v, key_cache, value_cache, meta, sm_scale, kernel_dtype, k_scale, v_scale,
                **sparse):  # key_bounds (None: this cache keeps no quest bounds)
        assert (k_scale, v_scale) == ((ks, vs) if fp8 else (scale, 2 * scale))
        assert sparse.get("key_bounds") is None
        out = exact_attention(q, k, v, key_cache, value_cache, meta, sm_scale, kernel_dtype,
                              k_scale, v_scale, **sparse)
        bs = key_cache.shape[2]
        blk, off = meta.slot_mapping // bs, meta.slot_mapping % bs
        # the new tokens' slots hold torch's rounding: [num_tokens, num_kv_heads, head_dim]
        for new, cache, s in ((k, key_cache, ks), (v, value_cache, vs)):
            want = (new / s).to(fmt) if fp8 else new.to(fmt)
            assert torch.equal(cache[blk, :, off], want.view(torch.uint8) if fp8 else want)
        # and attention is fp32 attention over the decoded cache
        k32 = _decode(key_cache, fmt, ks).clone()
        v32 = _decode(value_cache, fmt, vs).clone()
        ref = exact_attention(q, k32[blk, :, off], v32[blk, :, off], k32, v32, meta, sm_scale)
        assert float((out - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))
        calls.append(meta.num_decode_seqs)
        return out

    monkeypatch.setattr(llama, "paged_attention", checked)
    runner = _runner(model, config, prompts, kv_dtype, scale)
    real = runner.generate(prompts, STEPS, chunk_size=11, forced=fp32.tokens)
    assert any(calls) and not all(calls)  # steps with and without decode sequences ran

    # end to end: not a no-op, within a sanity bound of fp32 storage
    err = max(float((torch.log_softmax(a, -1) - torch.log_softmax(b, -1)).abs().max())
              for a, b in zip(real.logits, fp32.logits))
    assert 0 < err < LOGPROB_SANITY[kv_dtype]
