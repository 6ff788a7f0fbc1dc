"""LLM.chat (vLLM's offline chat API): conversations rendered with the checkpoint's chat template
exactly as transformers' apply_chat_template renders and tokenizes them, then generated as
generate() would; batches, continue_final_message, a custom template and clear errors."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from pagedllm import LLM, SamplingParams
from pagedllm.default_model import default_model_path

GREEDY = SamplingParams(max_tokens=6, temperature=0)
CONVS = [
    [{"role": "user", "content": "What is a list?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Explain dict"},
     {"role": "assistant", "content": "A mapping."}, {"role": "user", "content": "And set?"}],
]


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kv_blocks=128)


@pytest.fixture(scope="module")
def hf():
    return PreTrainedTokenizerFast.from_pretrained(default_model_path())


def test_prompts_equal_transformers_apply_chat_template(llm, hf):
    outs = llm.chat(CONVS, GREEDY, use_tqdm=False)
    for conv, out in zip(CONVS, outs):
        assert out.prompt == hf.apply_chat_template(conv, tokenize=False,
                                                    add_generation_prompt=True)
        ids = hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert out.prompt_token_ids == list(ids)
        alone = llm.generate([{"prompt_token_ids": list(ids)}], GREEDY, use_tqdm=False)[0]
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids


def test_one_conversation_and_text_parts(llm):
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is "},
                                          {"type": "text", "text": "a list?"}]}]
    (a,) = llm.chat(CONVS[0], GREEDY, use_tqdm=False)
    (b,) = llm.chat(parts, GREEDY, use_tqdm=False)
    assert a.prompt == b.prompt and a.outputs[0].token_ids == b.outputs[0].token_ids


def test_continue_final_message_and_custom_template(llm, hf):
    conv = CONVS[0] + [{"role": "assistant", "content": "A list is"}]
    (out,) = llm.chat(conv, GREEDY, use_tqdm=False, add_generation_prompt=False,
                      continue_final_message=True)
    assert out.prompt == hf.apply_chat_template(conv, tokenize=False,
                                                continue_final_message=True)
    assert out.prompt.endswith("A list is")
    (custom,) = llm.chat(CONVS[0], GREEDY, use_tqdm=False,
                         chat_template="{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                                       "{% endfor %}{{ eos_token if flag else '' }}",
                         add_generation_prompt=False, chat_template_kwargs={"flag": True})
    assert custom.prompt == "<user>What is a list?<|eos|>"
    assert custom.prompt_token_ids[0] == 1  # bos added: the template did not write it


@pytest.mark.parametrize("messages,kw,match", [
    ("hello", {}, "messages must be a conversation"),
    ([{"role": "user"}, "x"], {}, "messages must be a conversation"),
    ([[]], {}, "is an empty conversation"),
    ([{"role": "", "content": "x"}], {}, r"messages\[0\].role must be a non-empty string"),
    ([{"role": "user", "content": 5}], {}, r"messages\[0\].content must be a string"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], {}, "use generate"),
    (CONVS[0], {"continue_final_message": True}, "cannot both be true"),
    (CONVS[0], {"chat_template": "{% if %}"}, "not valid Jinja2"),
    (CONVS[0], {"chat_template": "{{ raise_exception('no system role') }}"},
     "no system role"),
])
def test_bad_conversations_are_value_errors(llm, messages, kw, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, GREEDY, use_tqdm=False, **kw)
    assert llm.kv_cache_stats()["used_blocks"] == 0
