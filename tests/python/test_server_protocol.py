"""Units of the server that need no engine: streaming deltas, chat templates, request checks,
logprobs shapes, SSE framing, metrics exposition."""

import json
import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pagedllm.metrics import EngineMetrics
from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput
from pagedllm.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate, ChatTemplateError
from pagedllm.server.errors import OpenAIError
from pagedllm.server.logprobs import (MIN_LOGPROB, chat_logprobs, completion_logprobs,
                                       echo_logprobs)
from pagedllm.server.protocol import ChatCompletionRequest, CompletionRequest, extra_fields
from pagedllm.server.sse import DONE_EVENT, sse_event
from pagedllm.streaming import ChoiceTracker, holdback_for


def comp(text, n_tokens, finish=None, stop_reason=None):
    return CompletionOutput(0, text, list(range(n_tokens)), None, None, finish, stop_reason)


# --- deltas ---------------------------------------------------------------------------------------
def test_deltas_without_stop_strings_send_text_as_it_comes():
    t = ChoiceTracker(holdback_for([]))
    assert t.advance(comp("He", 1)).text == "He"
    assert t.advance(comp("He", 2)) is None            # a token without text yet
    d = t.advance(comp("Hello", 3))
    assert (d.text, d.token_ids, d.text_offset) == ("llo", [1, 2], 2)
    d = t.advance(comp("Hello!", 4, "length"))
    assert (d.text, d.finish_reason) == ("!", "length")
    assert t.advance(comp("Hello!", 4, "length")) is None


def test_stop_string_prefix_is_held_back_and_never_sent():
    # The engine's text grows "ab", "abEN", then finds "END" and cuts before it.
    stops = ["END"]
    t = ChoiceTracker(holdback_for(stops))
    sent = [t.advance(comp("ab", 1)), t.advance(comp("abEN", 2)), t.advance(comp("ab", 3, "stop", "END"))]
    texts = [d.text for d in sent if d is not None]
    assert "".join(texts) == "ab"
    assert all("E" not in x for x in texts)
    assert sent[-1].finish_reason == "stop" and sent[-1].stop_reason == "END"


def test_holdback_releases_text_that_cannot_start_a_stop():
    t = ChoiceTracker(holdback_for(["\n\n", "###"]))   # holds 2 characters back
    assert t.advance(comp("abcdef", 3)).text == "abcd"
    d = t.advance(comp("abcdefg", 4))
    # "e" was held back; the new token's text "g" starts at 6 (its logprobs' text_offset)
    assert (d.text, d.token_ids, d.text_offset) == ("e", [3], 6)
    assert t.advance(comp("abcdefg", 4, "length")).text == "fg"


# --- chat template --------------------------------------------------------------------------------
MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]


def test_default_template_is_documented_format():
    t = ChatTemplate.for_model(None)
    assert t.source == DEFAULT_CHAT_TEMPLATE
    assert t.render(MESSAGES) == "system: Be terse.\nuser: Hi\nassistant:"
    assert t.render(MESSAGES, add_generation_prompt=False) == "system: Be terse.\nuser: Hi\n"


def test_template_from_tokenizer_config(tmp_path):
    template = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}"
                "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    t = ChatTemplate.for_model(str(tmp_path))
    text = t.render(MESSAGES)
    assert text == "<s><|system|>Be terse.</s><|user|>Hi</s><|assistant|>"
    assert t.starts_with_bos(text)
    assert not ChatTemplate.for_model(None).starts_with_bos(text)


def test_named_templates_use_default_and_override_file_wins(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}]}))
    assert ChatTemplate.for_model(str(tmp_path)).render(MESSAGES) == "DEFAULT"
    override = tmp_path / "mine.jinja"
    override.write_text("{{ messages | length }} messages{{ messages[0] | tojson }}")
    assert (ChatTemplate.for_model(str(tmp_path), str(override)).render(MESSAGES)
            == '2 messages{"role": "system", "content": "Be terse."}')


def test_template_errors_are_chat_template_errors(tmp_path):
    with pytest.raises(ChatTemplateError, match="not valid Jinja2"):
        ChatTemplate("{% for %}")
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="first must be user"):
        t.render(MESSAGES)
    with pytest.raises(ChatTemplateError, match="cannot read chat template"):
        ChatTemplate.for_model(None, str(tmp_path / "missing.jinja"))
    # The sandbox refuses attribute games.
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render(MESSAGES)


# --- request checks -------------------------------------------------------------------------------
def test_extra_fields_ignored_neutral_unsupported_unknown():
    ok = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], user="u",
                               metadata={"a": "b"}, tools=[], response_format={"type": "text"})
    assert extra_fields(ok) == []
    with pytest.raises(OpenAIError) as e:
        extra_fields(CompletionRequest(prompt="x", logit_bias={"1": 5}))
    assert e.value.status == 400 and e.value.param == "logit_bias" and "not supported" in e.value.message
    # Unknown fields are ignored and named (vLLM), or refused when strict.
    assert extra_fields(CompletionRequest(prompt="x", temprature=0.5)) == ["temprature"]
    with pytest.raises(OpenAIError) as e:
        extra_fields(CompletionRequest(prompt="x", temprature=0.5), strict=True)
    assert e.value.param == "temprature" and "unknown field" in e.value.message


def test_stop_list_limits():
    assert CompletionRequest(prompt="x", stop="a").stop_list() == ["a"]
    with pytest.raises(OpenAIError, match="non-empty"):
        CompletionRequest(prompt="x", stop=["a", ""]).stop_list()
    with pytest.raises(OpenAIError, match="at most 16"):
        CompletionRequest(prompt="x", stop=[str(i) for i in range(17)]).stop_list()


def test_message_content_parts():
    m = ChatCompletionRequest(messages=[{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]).messages[0]
    assert m.text(0) == "ab"
    img = ChatCompletionRequest(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]).messages[0]
    with pytest.raises(OpenAIError, match="only text parts"):
        img.text(0)


# --- logprobs -------------------------------------------------------------------------------------
POSITIONS = [
    {5: Logprob(-0.1, 1, "a"), 6: Logprob(-2.5, 2, "b"), 7: Logprob(-3.0, 3, "c")},
    {9: Logprob(-math.inf, 4, "zz"), 5: Logprob(-0.2, 1, "a"), 6: Logprob(-1.0, 2, "b"),
     7: Logprob(-4.0, 3, "c")},
]


def test_completion_logprobs_shape():
    lp = completion_logprobs([5, 9], POSITIONS, 2, text_offset=10)
    assert lp.tokens == ["a", "zz"]
    assert lp.token_logprobs == [-0.1, MIN_LOGPROB]
    assert lp.top_logprobs[0] == {"a": -0.1, "b": -2.5}
    assert lp.top_logprobs[1] == {"a": -0.2, "b": -1.0, "zz": MIN_LOGPROB}  # sampled one added
    assert lp.text_offset == [10, 11]


def test_echo_offsets_index_the_echoed_text():
    """A bos the tokenizer added has no text in the echo (offset 0); offsets never decrease and
    never pass the text's end, where the generated tokens start (they went back by the bos's
    length before)."""
    names = {1: "<s>", 5: "a", 6: "b", 9: "zz"}
    positions = [None, POSITIONS[0], POSITIONS[1]]
    lp = echo_logprobs([1, 5, 9], positions, 1, names.get, text="azz")
    assert lp.tokens == ["<s>", "a", "zz"] and lp.text_offset == [0, 0, 1]
    plain = echo_logprobs([5, 9], [None, POSITIONS[1]], 1, names.get, text="azz")
    assert plain.text_offset == [0, 1]
    # Tokens named by id do not spell the text: offsets stay monotonic, capped at its end.
    ids = echo_logprobs([1, 5, 9], positions, 1, names.get, as_ids=True, text="azz")
    assert ids.text_offset == sorted(ids.text_offset) and max(ids.text_offset) <= 3


def test_chat_logprobs_shape():
    lp = chat_logprobs([5], POSITIONS[:1], 2)
    tok = lp.content[0]
    assert (tok.token, tok.logprob, tok.bytes) == ("a", -0.1, [97])
    assert [(t.token, t.logprob) for t in tok.top_logprobs] == [("a", -0.1), ("b", -2.5)]
    json.loads(lp.model_dump_json())


def test_sse_framing():
    assert sse_event('{"a": 1}') == 'data: {"a": 1}\n\n'
    assert DONE_EVENT == "data: [DONE]\n\n"


# --- metrics --------------------------------------------------------------------------------------
def _out(rid, n_tokens, finished, t0=100.0):
    m = {"arrival_time": t0, "first_token_time": t0 + 0.5}
    if finished:
        m["finish_time"] = t0 + 2.0
    return RequestOutput(rid, None, [1, 2], None,
                         [CompletionOutput(0, "", list(range(n_tokens)), None, None,
                                           "length" if finished else None)], finished, m)


def _parse(metrics):
    out = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                 + ((("le", s.labels["le"]),) if "le" in s.labels else ()))] = s.value
    return out


def test_metrics_names_values_and_histograms():
    stats = {"used_blocks": 3, "num_blocks": 12, "num_requests_running": 2,
             "num_requests_waiting": 1, "prefix_cache_queries": 40, "prefix_cache_hits": 16,
             "num_preemptions": 4, "num_prompt_tokens": 40, "num_generation_tokens": 7}
    m = EngineMetrics(lambda: stats, "tiny")
    m.on_outputs([_out("a", 1, False)], now=100.5)
    m.on_outputs([_out("a", 2, False)], now=100.7)
    m.on_outputs([_out("a", 3, True)], now=102.0)
    m.on_abort("b")
    got = _parse(m)
    lab = (("model_name", "tiny"),)
    assert got[("pagedllm:kv_cache_usage_perc", lab)] == pytest.approx(0.25)
    assert got[("pagedllm:num_requests_running", lab)] == 2
    assert got[("pagedllm:num_requests_waiting", lab)] == 1
    assert got[("pagedllm:prefix_cache_queries_total", lab)] == 40
    assert got[("pagedllm:prefix_cache_hits_total", lab)] == 16
    assert got[("pagedllm:num_preemptions_total", lab)] == 4
    assert got[("pagedllm:prompt_tokens_total", lab)] == 40
    assert got[("pagedllm:generation_tokens_total", lab)] == 7
    assert got[("pagedllm:time_to_first_token_seconds_count", lab)] == 1
    assert got[("pagedllm:time_to_first_token_seconds_sum", lab)] == pytest.approx(0.5)
    assert got[("pagedllm:inter_token_latency_seconds_count", lab)] == 2
    assert got[("pagedllm:inter_token_latency_seconds_sum", lab)] == pytest.approx(0.2 + 1.3)
    assert got[("pagedllm:e2e_request_latency_seconds_sum", lab)] == pytest.approx(2.0)
    assert got[("pagedllm:request_success_total", (("finished_reason", "length"),) + lab)] == 1
    assert got[("pagedllm:request_success_total", (("finished_reason", "abort"),) + lab)] == 1
    assert not any(name.endswith("_created") for name, _ in got)


def test_two_metrics_objects_do_not_clash():
    a = EngineMetrics(lambda: {}, "a")
    b = EngineMetrics(lambda: {}, "b")
    assert b"model_name=\"a\"" in a.render() and b"model_name=\"b\"" in b.render()


def test_unset_sampling_fields_take_the_checkpoint_defaults():
    from types import SimpleNamespace

    from pagedllm.server.generation import sampling_params

    state = SimpleNamespace(sampling_defaults={"temperature": 0.8, "top_p": 0.95, "top_k": 40})
    p = sampling_params(state, CompletionRequest(prompt="x"), 16, [])
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (0.8, 0.95, 40, 0.0)
    p = sampling_params(state, CompletionRequest(prompt="x", temperature=0, top_k=-1), 16, [])
    assert (p.temperature, p.top_p, p.top_k) == (0.0, 0.95, -1)  # what the request sets wins
    p = sampling_params(SimpleNamespace(sampling_defaults={}), ChatCompletionRequest(
        messages=[{"role": "user", "content": "x"}]), 16, [])
    assert (p.temperature, p.top_p) == (1.0, 1.0)  # OpenAI's defaults otherwise
    with pytest.raises(OpenAIError) as e:
        sampling_params(state, CompletionRequest(prompt="x", min_tokens=20), 16, [])
    assert e.value.param == "min_tokens"
