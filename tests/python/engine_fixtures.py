"""Fixtures of the engine tests: a small random-weight checkpoint and transformers' answers."""

from __future__ import annotations

import functools
import random
from typing import List

import pytest
import torch

# A model small enough that 32+ requests with transformers as the reference stay fast, with GQA.
ENGINE_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                    max_position_embeddings=512)


@pytest.fixture(scope="session")
def engine_model_dir(tmp_path_factory) -> str:
    """Directory of a random-weight Llama checkpoint (no tokenizer: prompts are token ids)."""
    from pagedllm.model import write_random_checkpoint

    path = tmp_path_factory.mktemp("engine_model")
    write_random_checkpoint(path, preset=ENGINE_MODEL, seed=1234, initializer_range=0.1)
    return str(path)


def mixed_prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 70, vocab: int = 512) -> List[List[int]]:
    """n prompts of varied lengths in [lo, hi], avoiding the EOS id 2."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(lo, hi)
        out.append([rng.choice([t for t in range(3, vocab)]) for _ in range(length)])
    return out


@functools.lru_cache(maxsize=4)
def _hf_model(path: str):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                             attn_implementation="eager")
    return model.eval()


def hf_greedy(path: str, prompt: List[int], max_tokens: int) -> List[int]:
    """transformers' greedy continuation of one prompt (EOS ignored), max_tokens long."""
    model = _hf_model(path)
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    return out[0, len(prompt):].tolist()


def hf_logprobs(path: str, tokens: List[int]) -> torch.Tensor:
    """log_softmax of transformers' logits at every position of `tokens`: [len, vocab]."""
    model = _hf_model(path)
    with torch.inference_mode():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def assert_pool_clean(llm) -> None:
    """Every block is back in the free or cached pool and no sequence is left."""
    s = llm.kv_cache_stats()
    assert s["used_blocks"] == 0, s
    assert s["free_blocks"] + s["cached_blocks"] == s["num_blocks"], s
    assert s["num_seqs"] == 0 and s["tokens_stored"] == 0, s
    assert not llm.engine.has_unfinished_requests()


def tok(prompts: List[List[int]]) -> List[dict]:
    """Token-id prompts in the engine's {"prompt_token_ids": ...} form."""
    return [{"prompt_token_ids": p} for p in prompts]


def greedy(max_tokens: int, **kw):
    """Greedy SamplingParams that ignore EOS (fixed-length outputs to compare)."""
    from pagedllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)
