"""fp16 / bf16 / fp8 KV storage at the model level.

Exact semantics: a run with a half-precision or fp8 cache must give the logits of an fp32-cache
run whose new keys and values are rounded through the same format (torch's own float16,
bfloat16, float8_e4m3fn, float8_e5m2 casts) before they are cached, up to fp32 summation order.
Quality is measured by benchmarks/bench_kv_dtypes.py (docs/BENCHMARKS.md); here only a sanity
bound on the logprob error against fp32 storage is asserted.
"""

import pytest
import torch

import pagedllm.model.llama as llama
from model_fixtures import PagedRunner, blocks_needed, make_prompts
from model_fixtures import torch_one_thread  # noqa: F401  (fixture)
from pagedllm.model import load_model, write_random_checkpoint

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ROUND_THROUGH = {"fp16": torch.float16, "bf16": torch.bfloat16,
                 "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# sanity bound on max |logprob - logprob with fp32 storage| (measured: see BENCHMARKS.md)
LOGPROB_SANITY = {"fp16": 0.05, "bf16": 0.5, "fp8_e4m3": 2.0, "fp8_e5m2": 4.0}
LOGIT_RTOL = 5e-5
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
    fp32 = _run(model, config, prompts, "auto")
    return model, config, prompts, fp32


def _run(model, config, prompts, kv_dtype, forced=None, scale=1.0):
    runner = PagedRunner(model, config, 16, blocks_needed(prompts, STEPS, 16), kv_cache_dtype=kv_dtype)
    runner.kv.k_scale, runner.kv.v_scale = scale, 2 * scale
    return runner.generate(prompts, STEPS, chunk_size=11, forced=forced)


@pytest.mark.parametrize("kv_dtype, scale", [(d, 1.0) for d in sorted(ROUND_THROUGH)]
                         + [("fp8_e4m3", 0.25), ("fp8_e5m2", 4.0)])
def test_storage_dtype_equals_rounding_keys_and_values(setup, kv_dtype, scale, monkeypatch):
    model, config, prompts, fp32 = setup
    real = _run(model, config, prompts, kv_dtype, forced=fp32.tokens, scale=scale)

    fmt = ROUND_THROUGH[kv_dtype]
    # fp8 stores x / scale (k_scale = scale, v_scale = 2 * scale); other formats ignore scales.
    ks, vs = (scale, 2 * scale) if kv_dtype.startswith("fp8") else (1.0, 1.0)
    exact_attention = llama.paged_attention

    def rounded(q, k, v, *args, **kwargs):
        # k, v: [num_tokens, num_kv_heads, head_dim] -> through the storage format and back
        k = (k / ks).to(fmt).float() * ks
        v = (v / vs).to(fmt).float() * vs
        return exact_attention(q, k, v, *args, **kwargs)

    monkeypatch.setattr(llama, "paged_attention", rounded)
    emulated = _run(model, config, prompts, "auto", forced=fp32.tokens)
    for ours, ref in zip(real.logits, emulated.logits):
        scale_of_logits = max(1.0, float(ref.abs().max()))
        assert float((ours - ref).abs().max()) <= LOGIT_RTOL * scale_of_logits

    # and the storage is not a no-op, but stays within a sanity bound of fp32 storage
    err = max(float((torch.log_softmax(a, -1) - torch.log_softmax(b, -1)).abs().max())
              for a, b in zip(real.logits, fp32.logits))
    assert 0 < err < LOGPROB_SANITY[kv_dtype]
