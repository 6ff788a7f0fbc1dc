"""A completion that ends at EOS does not carry the EOS token's text, even with
skip_special_tokens=False, unless include_stop_str_in_output (vLLM's rule): the bundled model
answered " the module.\\n<|eos|>"."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kv_blocks=64)  # the bundled default model


def _run(llm, **kw):
    params = SamplingParams(max_tokens=30, temperature=0, repetition_penalty=1.5, **kw)
    return llm.generate(["The capital of"], params, use_tqdm=False)[0].outputs[0]


def test_eos_text_is_dropped_unless_asked_for(llm):
    eos = "<|eos|>"  # the bundled model's tokenizer_config.json eos_token
    plain = _run(llm)
    shown = _run(llm, skip_special_tokens=False)
    kept = _run(llm, skip_special_tokens=False, include_stop_str_in_output=True)
    assert plain.finish_reason == shown.finish_reason == kept.finish_reason == "stop"
    assert plain.token_ids == shown.token_ids == kept.token_ids
    assert shown.text == plain.text and not shown.text.endswith(eos)
    assert kept.text == plain.text + eos


def test_stop_token_text_is_dropped_unless_asked_for(llm):
    # A stop_token_ids token's text stayed in the completion ('.\n\nclass'); vLLM drops it
    # unless include_stop_str_in_output, as for EOS.
    tok = llm.get_tokenizer()
    base = _run(llm, ignore_eos=True)
    stop = base.token_ids[3]
    assert tok.decode([stop]) != ""
    out = _run(llm, stop_token_ids=[stop])
    kept = _run(llm, stop_token_ids=[stop], include_stop_str_in_output=True)
    assert out.token_ids == kept.token_ids == base.token_ids[:4] and out.stop_reason == stop
    assert out.text == tok.decode(base.token_ids[:3])
    assert kept.text == tok.decode(base.token_ids[:4])
