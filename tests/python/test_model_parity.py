"""The paged Llama forward against transformers' LlamaForCausalLM (fp32, eager attention).

For random-weight checkpoints of several shapes, a batch of 16 prompts of different lengths
runs together through PagedRunner (an engine-like loop on _core.KVCacheManager): prefill whole
or in chunks of 13 tokens (so short prompts decode while long ones still prefill), then 64
greedy decode steps, with block sizes 1, 16 and 128. Every computed position's logits are
compared with transformers' logits of the same sequence (prompt + generated tokens, teacher
forced), and every greedy token must be transformers' argmax.

Tolerance (fp32): max |ours - transformers| <= LOGIT_RTOL * max(1, max |transformers logit|).
Both compute in float32 with the same RMSNorm/RoPE/SiLU arithmetic; the differences come only
from summation order in the fused matmuls and the paged attention kernels (measured: about
2e-6 of the logit scale; see docs/BENCHMARKS.md, "Model").
"""

import pytest
import torch

from model_fixtures import (PARITY_PROMPT_LENGTHS, PagedRunner, blocks_needed, hf_logits, load_hf,
                            make_prompts)
from model_fixtures import torch_one_thread  # noqa: F401  (fixture)
from pagedllm.model import load_model, packed_linear, write_random_checkpoint
from pagedllm.model.llama import Linear

pytestmark = pytest.mark.usefixtures("torch_one_thread")

LOGIT_RTOL = 5e-5
DECODE_STEPS = 64
MAX_NEW_TOKENS = DECODE_STEPS + 1  # the first token comes from the prefill step
CHUNK = 13

# initializer_range 0.1 makes attention peaked and logits O(5), so RoPE, masking and cache
# errors show far above the tolerance (test_parity_check_is_sensitive).
COMMON = dict(num_hidden_layers=2, initializer_range=0.1, rms_norm_eps=1e-5)
MODELS = {
    # GQA, head_dim 32
    "gqa": (dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=256, vocab_size=512), {}),
    # MQA, head_dim 64, q/k/v/o and MLP biases
    "mqa_bias": (dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=192, vocab_size=640, attention_bias=True, mlp_bias=True), {}),
    # MHA, head_dim 128
    "hd128": (dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=2,
                   intermediate_size=256, vocab_size=512), {}),
    # tied embeddings, llama3 rope (all three bands within the positions used), head_dim given
    # explicitly and != hidden / heads
    "tied_llama3": (dict(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         intermediate_size=160, vocab_size=1000, tie_word_embeddings=True,
                         rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64}), {}),
    # 3 shards in bf16 (converted to fp32 on load), MQA with 4 heads, linear rope
    "sharded_bf16": (dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=1,
                          intermediate_size=256, vocab_size=768,
                          rope_scaling={"rope_type": "linear", "factor": 2.0}),
                     dict(num_shards=3, dtype=torch.bfloat16)),
}


class Reference:
    """A loaded model, its transformers twin, the prompts, and memoised reference logits."""

    def __init__(self, path):
        self.path = path
        self.model, self.config = load_model(path)
        self.hf = load_hf(path)
        self.prompts = make_prompts(self.config.vocab_size, PARITY_PROMPT_LENGTHS, seed=1)
        self._memo = {}

    def logits(self, tokens):
        key = tuple(tokens)
        if key not in self._memo:
            self._memo[key] = hf_logits(self.hf, tokens)
        return self._memo[key]

    def check(self, result, prompts):
        """Asserts the run matches transformers; returns the largest relative logit error."""
        worst = 0.0
        for p, toks, ours, first in zip(prompts, result.tokens, result.logits, result.first_position):
            assert len(toks) == MAX_NEW_TOKENS
            ref = self.logits(p + toks[:-1])[first:]            # [positions computed, vocab]
            assert ours.shape == ref.shape
            scale = max(1.0, float(ref.abs().max()))
            err = float((ours - ref).abs().max()) / scale
            assert err <= LOGIT_RTOL, f"prompt of {len(p)}: logit error {err:.2e} of scale {scale:.2f}"
            assert toks == ref[len(p) - 1 - first:].argmax(-1).tolist(), f"prompt of {len(p)}"
            worst = max(worst, err)
        return worst


@pytest.fixture(scope="module", params=sorted(MODELS))
def ref(request, tmp_path_factory):
    shape, write_args = MODELS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(path, {**COMMON, **shape}, seed=7, **write_args)
    return Reference(path)


@pytest.mark.parametrize("block_size", [1, 16, 128])
@pytest.mark.parametrize("prefill", ["whole", "chunked"])
def test_logits_and_greedy_tokens_match_transformers(ref, block_size, prefill):
    runner = PagedRunner(ref.model, ref.config, block_size,
                         blocks_needed(ref.prompts, MAX_NEW_TOKENS, block_size))
    result = runner.generate(ref.prompts, MAX_NEW_TOKENS, None if prefill == "whole" else CHUNK)
    if prefill == "chunked":
        assert runner.mixed_steps > 0  # decode and prefill sequences shared steps
    ref.check(result, ref.prompts)


def test_cached_prefixes_are_reused_and_still_match(ref):
    # Batch A fills the prefix cache; batch B shares 40 or 70 leading tokens with some of A's
    # prompts, so its prefill starts after the cached full blocks.
    bs = 16
    a = ref.prompts
    g = torch.Generator().manual_seed(11)
    tails = [torch.randint(0, ref.config.vocab_size, (n,), generator=g).tolist() for n in (9, 30, 1)]
    b = [a[-1][:40] + tails[0], a[-2][:70] + tails[1], a[-3][:40] + tails[2], a[0] + tails[1]]
    runner = PagedRunner(ref.model, ref.config, bs, blocks_needed(a + b, MAX_NEW_TOKENS, bs),
                         enable_prefix_caching=True)
    ref.check(runner.generate(a, MAX_NEW_TOKENS, CHUNK), a)
    result = runner.generate(b, MAX_NEW_TOKENS, CHUNK)
    assert result.first_position == [32, 64, 32, 0]
    ref.check(result, b)


@pytest.mark.skipif(not packed_linear.available(), reason="torch built without oneDNN")
def test_prepacked_weights_match_transformers(ref, monkeypatch):
    # The engine's default: projections multiplied against oneDNN-prepacked weights (every one
    # here: the size threshold that leaves small weights strided is lifted).
    monkeypatch.setattr(packed_linear, "MIN_PACKED_ELEMENTS", 0)
    model, config = load_model(ref.path, prepack=True)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed is not None and m.weight is None for m in linears)
    assert (model.lm_head is None) == config.tie_word_embeddings  # a tied head is not copied
    runner = PagedRunner(model, config, 16, blocks_needed(ref.prompts, MAX_NEW_TOKENS, 16))
    ref.check(runner.generate(ref.prompts, MAX_NEW_TOKENS, CHUNK), ref.prompts)


def test_parity_check_is_sensitive(ref):
    # A 1% error in the RoPE frequencies must fail the tolerance by a wide margin.
    runner = PagedRunner(ref.model, ref.config, 16, blocks_needed(ref.prompts, MAX_NEW_TOKENS, 16))
    saved = ref.model.rotary.inv_freq.clone()
    try:
        ref.model.rotary.inv_freq.mul_(1.01)
        result = runner.generate(ref.prompts[-4:], MAX_NEW_TOKENS)
    finally:
        ref.model.rotary.inv_freq.copy_(saved)
    worst = 0.0
    for p, toks, ours in zip(ref.prompts[-4:], result.tokens, result.logits):
        reference = ref.logits(p + toks[:-1])
        worst = max(worst, float((ours - reference).abs().max()) / float(reference.abs().max()))
    assert worst > 1000 * LOGIT_RTOL
