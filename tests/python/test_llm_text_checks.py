"""Lone surrogates in prompts (issue 20, defect 8): the LLM API raises a ValueError naming the
argument (it was a TypeError from deep inside the tokenizer), and nothing runs."""

import pytest

from pagedllm.text_checks import check_text, lone_surrogate_at


def test_lone_surrogate_at():
    assert lone_surrogate_at("plain") == -1
    assert lone_surrogate_at("emoji \U0001F600") == -1  # a real pair is one code point
    assert lone_surrogate_at("ab\ud800") == 2 and lone_surrogate_at("\udfff") == 0
    with pytest.raises(ValueError, match=r"^messages\[0\]: lone surrogate U\+DC00 at index 1"):
        check_text("x\udc00", "messages[0]")


@pytest.fixture(scope="module")
def llm():
    from pagedllm import LLM

    return LLM(num_kv_blocks=32)


@pytest.mark.parametrize("prompts,where", [
    ("\ud800", r"prompts\[0\]"),
    (["fine", "bad \udfff"], r"prompts\[1\]"),
    ([{"prompt": "a\ud83d"}], r'prompts\[0\]\["prompt"\]'),
])
def test_generate_names_the_prompt(llm, prompts, where):
    from pagedllm import SamplingParams

    with pytest.raises(ValueError, match=where + ": lone surrogate"):
        llm.generate(prompts, SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests()  # checked before anything was added
    (out,) = llm.generate("still fine", SamplingParams(max_tokens=2, temperature=0))
    assert len(out.outputs[0].token_ids) >= 1


def test_beam_search_names_the_prompt(llm):
    from pagedllm.sampling_params import BeamSearchParams

    with pytest.raises(ValueError, match=r"prompts\[0\]: lone surrogate"):
        llm.beam_search(["\ud800"], BeamSearchParams(beam_width=2, max_tokens=2))
