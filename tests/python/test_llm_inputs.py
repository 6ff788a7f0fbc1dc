"""LLM.generate refuses malformed prompts and sampling parameters with a ValueError naming the
prompt (token ids that are floats or strings used to be rounded or parsed silently; a None
prompt or a dict of parameters gave bare TypeErrors / AttributeErrors), runs nothing and leaks
nothing."""

from __future__ import annotations

import numpy as np
import pytest

from engine_fixtures import assert_pool_clean, engine_model_dir  # noqa: F401
from pagedllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(engine_model_dir):  # noqa: F811
    return LLM(engine_model_dir, block_size=4, num_kv_blocks=64)


@pytest.mark.parametrize("prompt,match", [
    ({"prompt_token_ids": [1.9, 474.2]}, r"prompt_token_ids\[0\] must be an integer token id, got 1.9"),
    ({"prompt_token_ids": ["1", "474"]}, r"prompt_token_ids\[0\] must be an integer"),
    ({"prompt_token_ids": [1, True]}, r"prompt_token_ids\[1\] must be an integer"),
    ({"prompt_token_ids": None}, "prompt_token_ids must be a list of integer token ids, got NoneType"),
    ({"prompt_token_ids": "abc"}, "prompt_token_ids must be a list of integer token ids, got str"),
    ({"prompt_token_ids": np.array([1.0, 2.0])}, "prompt_token_ids must be a 1-D array of integer"),
    ({"prompt": None}, "the prompt is None"),
    ([None], r"prompt\[0\] must be an integer"),
])
def test_malformed_prompts_name_the_prompt(llm, prompt, match):
    good = {"prompt_token_ids": [1, 5, 9]}
    with pytest.raises(ValueError, match=r"^prompt 1: " + match):
        llm.generate([good, prompt], SamplingParams(max_tokens=2), use_tqdm=False)
    assert_pool_clean(llm)


def test_integer_forms_are_accepted(llm):
    params = SamplingParams(max_tokens=2, temperature=0)
    ref = llm.generate([{"prompt_token_ids": [1, 5, 9]}], params, use_tqdm=False)
    for ids in (np.array([1, 5, 9], dtype=np.int64), [np.int32(1), 5, np.int64(9)], (1, 5, 9)):
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        assert out[0].outputs[0].token_ids == ref[0].outputs[0].token_ids


def test_messages_do_not_carry_the_internal_request_id(llm):
    with pytest.raises(ValueError) as e:
        llm.generate([{"prompt_token_ids": [1] * 5000}], SamplingParams(max_tokens=2),
                     use_tqdm=False)
    assert str(e.value).startswith("prompt 0: prompt (5000 tokens)") and "llm-" not in str(e.value)


@pytest.mark.parametrize("params,match", [
    (dict(max_tokens=3), "sampling_params must be a SamplingParams or a list of them, got dict"),
    ([dict(max_tokens=3)], r"sampling_params\[0\] must be a SamplingParams, got dict"),
    ("greedy", "got str"),
])
def test_sampling_params_of_the_wrong_type(llm, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([{"prompt_token_ids": [1, 5]}], params, use_tqdm=False)
    assert_pool_clean(llm)


def test_stop_token_ids_outside_the_vocabulary_are_refused(llm):
    with pytest.raises(ValueError, match=r"^prompt 0: SamplingParams.stop_token_ids holds 600, "
                                         r"outside the vocabulary \[0, 512\)"):
        llm.generate([{"prompt_token_ids": [1, 5]}],
                     SamplingParams(max_tokens=2, stop_token_ids=[3, 600]), use_tqdm=False)
    assert_pool_clean(llm)


def test_checkpoint_max_new_tokens_is_fitted_to_the_context(engine_model_dir, tmp_path):  # noqa: F811
    # generation_config.json's max_new_tokens (here 500) is a default, not the caller's
    # demand: with max_model_len 64 a default request used to be refused ("prompt + max_tokens
    # exceeds max_model_len"); it now runs up to the context limit, as vLLM does. A
    # max_tokens the caller sets is still checked.
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(engine_model_dir, model)
    (model / "generation_config.json").write_text(json.dumps(
        {"max_new_tokens": 500, "do_sample": False, "min_new_tokens": 0}))
    llm = LLM(str(model), block_size=4, num_kv_blocks=64, max_model_len=64)
    prompt = {"prompt_token_ids": list(range(1, 41))}  # 40 tokens: room for 24
    out = llm.generate([prompt], use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) <= 24  # 24 unless the random model sampled EOS first
    rid = llm.engine.add_request(None, prompt, SamplingParams(max_tokens=500, ignore_eos=True),
                                 default_max_tokens=True)
    assert llm.engine.scheduler.requests[rid].params.max_tokens == 24
    llm.engine.abort_request([rid])
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        llm.generate([prompt], SamplingParams(max_tokens=500), use_tqdm=False)
    assert_pool_clean(llm)
