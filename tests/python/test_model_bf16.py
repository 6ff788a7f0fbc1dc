"""bfloat16 model dtype (opt-in; float32 is the exact reference, see test_model_parity).

bf16 rounds every activation, and the attention kernels accumulate in fp32 where transformers'
eager attention rounds scores and probabilities to bf16, so agreement is statistical: this test
bounds it against transformers in bf16, on the same (teacher-forced) tokens.
"""

import pytest
import torch

from model_fixtures import PARITY_PROMPT_LENGTHS, PagedRunner, blocks_needed, make_prompts
from model_fixtures import torch_one_thread  # noqa: F401  (fixture)
from pagedllm.model import load_model, write_random_checkpoint

pytestmark = pytest.mark.usefixtures("torch_one_thread")

STEPS = 33


def test_bf16_model_agrees_with_transformers_bf16(tmp_path):
    from transformers import LlamaForCausalLM

    write_random_checkpoint(tmp_path, dict(hidden_size=128, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2,
                                           intermediate_size=256, vocab_size=512,
                                           initializer_range=0.1), seed=7)
    model, config = load_model(tmp_path, dtype=torch.bfloat16)
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    hf = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager",
                                          dtype=torch.bfloat16).eval()
    prompts = make_prompts(config.vocab_size, PARITY_PROMPT_LENGTHS, seed=1)
    runner = PagedRunner(model, config, 16, blocks_needed(prompts, STEPS, 16))
    assert runner.kv.pool.dtype == torch.bfloat16  # "auto" KV storage = the model dtype
    result = runner.generate(prompts, STEPS, chunk_size=13)

    worst, agree, total = 0.0, 0, 0
    for p, toks, ours in zip(prompts, result.tokens, result.logits):
        with torch.inference_mode():
            ref = hf(torch.tensor([p + toks[:-1]])).logits[0].float()
        worst = max(worst, float((ours.log_softmax(-1) - ref.log_softmax(-1)).abs().max()))
        agree += int((ref[len(p) - 1:].argmax(-1) == torch.tensor(toks)).sum())
        total += len(toks)
    assert worst < 0.5          # measured 0.12
    assert agree / total > 0.9  # measured 0.98


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_bf16_model_on_fp8_cache_agrees_with_the_exact_engine(tmp_path, kv_cache_dtype):
    """A bf16 model on an fp8 cache decodes with bf16 dot products under "auto" where the CPU
    has them (only the probabilities rounded to bf16, as transformers' bf16 attention rounds
    them); the same run on the exact engine is the reference, the auto run teacher-forced on
    its tokens so every step compares the same context. Without AVX512_BF16, auto is the
    exact engine and the runs are identical."""
    from pagedllm import _core

    write_random_checkpoint(tmp_path, dict(hidden_size=128, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2,
                                           intermediate_size=256, vocab_size=512,
                                           initializer_range=0.1), seed=8)
    model, config = load_model(tmp_path, dtype=torch.bfloat16)
    prompts = make_prompts(config.vocab_size, PARITY_PROMPT_LENGTHS, seed=2)
    blocks = blocks_needed(prompts, STEPS, 16)
    exact = _core.cpu_engines()[0]
    try:
        _core.set_cpu_engine(exact)
        ref = PagedRunner(model, config, 16, blocks, kv_cache_dtype).generate(
            prompts, STEPS, chunk_size=13)
        _core.set_cpu_engine("auto")
        ours = PagedRunner(model, config, 16, blocks, kv_cache_dtype).generate(
            prompts, STEPS, chunk_size=13, forced=ref.tokens)
    finally:
        _core.set_cpu_engine("auto")
    if "avx512_bf16" not in _core.cpu_engines():
        assert all(torch.equal(a, b) for a, b in zip(ours.logits, ref.logits))
        return
    worst, agree, total = 0.0, 0, 0
    for p, a, b in zip(prompts, ours.logits, ref.logits):
        a, b = a[len(p) - 1:].float(), b[len(p) - 1:].float()  # [STEPS, vocab]: decode steps
        worst = max(worst, float((a.log_softmax(-1) - b.log_softmax(-1)).abs().max()))
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    assert worst < 0.25, worst          # measured 0.10 (e4m3), 0.15 (e5m2)
    assert agree / total > 0.9, agree / total  # measured 0.975, 0.98
