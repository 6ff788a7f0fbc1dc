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
