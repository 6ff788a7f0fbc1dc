"""What real clients send (issue 20), over a real socket with ScriptedEngine behind it: explicit
nulls, stream_options, vLLM extras, unknown fields, echo with logprobs, max_tokens 0, CORS and
the utility routes."""

import json

import httpx
import pytest

from pagedllm.server import ServerSettings, create_app
from server_fixtures import ScriptedEngine, ServerThread, client, scripted_completion  # noqa: F401

ENC = ScriptedEngine().tokenizer.encode


@pytest.fixture(scope="module")
def server():
    engine = ScriptedEngine(step_delay=0.001, model_path="/srv/secret/models/scripted")
    with ServerThread(create_app(engine, ServerSettings(max_tokens_limit=300))) as s:
        s.engine = engine
        yield s


def sse(response):
    assert response.status_code == 200, response.text
    body = response.text
    assert body.endswith("data: [DONE]\n\n")
    return [json.loads(c[len("data: "):]) for c in body.split("\n\n")[:-2]]


NULLABLE = ["temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
            "presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty",
            "min_tokens", "ignore_eos", "stop_token_ids", "skip_special_tokens",
            "include_stop_str_in_output", "prompt_logprobs", "truncate_prompt_tokens",
            "return_tokens_as_token_ids", "cache_salt", "use_beam_search", "length_penalty",
            "user", "logit_bias", "tools", "response_format", "model"]


def test_explicit_null_means_unset(client):
    body = {"prompt": "hi", "max_tokens": 5, **{k: None for k in NULLABLE},
            "echo": None, "logprobs": None, "best_of": None, "suffix": None,
            "add_special_tokens": None}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == scripted_completion(ENC("hi"), 5)
    chat = {"messages": [{"role": "user", "content": "hi", "name": None}], "max_tokens": 3,
            **{k: None for k in NULLABLE}, "logprobs": None, "top_logprobs": None,
            "max_completion_tokens": None, "add_generation_prompt": None,
            "continue_final_message": None, "chat_template_kwargs": None,
            "add_special_tokens": None}
    r = client.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


def test_continuous_usage_stats_and_include_obfuscation(client):
    # guidellm's default stream_options, and OpenAI's include_obfuscation.
    opts = {"include_usage": True, "continuous_usage_stats": True, "include_obfuscation": False}
    chunks = sse(client.post("/v1/completions", json={
        "prompt": "ab", "max_tokens": 4, "stream": True, "stream_options": opts}))
    prompt_tokens = len(ENC("ab"))
    assert all(c["usage"] is not None for c in chunks)
    completion = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert completion == sorted(completion) and completion[-1] == 4
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    chat = sse(client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3,
        "stream": True, "stream_options": opts}))
    assert all(c["usage"] is not None for c in chat)
    assert chat[-1]["usage"]["completion_tokens"] == 3
    # Without continuous_usage_stats only the last chunk has usage.
    plain = sse(client.post("/v1/completions", json={
        "prompt": "ab", "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": True}}))
    assert [c["usage"] is not None for c in plain] == [False] * (len(plain) - 1) + [True]


def test_unknown_fields_are_ignored_with_a_header(client, caplog):
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "temprature": 0.1,
                                             "my_extra": {"a": 1}})
    assert r.status_code == 200, r.text
    assert r.headers["x-ignored-fields"] == "temprature, my_extra"
    assert any("temprature" in rec.getMessage() for rec in caplog.records)
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True,
                                             "foo": 1})
    assert r.headers["x-ignored-fields"] == "foo"
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "user": "u"})
    assert "x-ignored-fields" not in r.headers  # informational fields are expected
    # Names that cannot go in a header as they are: non-ASCII, control characters, very long.
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "tempé": 1,
                                             "a\r\nb": 1, "z" * 5000: 1})
    assert r.status_code == 200, r.text
    header = r.headers["x-ignored-fields"]
    assert header.startswith("temp?, a??b, zzz") and len(header) <= 512


def test_strict_fields_refuse_unknown_fields():
    app = create_app(ScriptedEngine(), ServerSettings(strict_fields=True))
    with ServerThread(app) as s:
        r = httpx.post(s.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "temprature": 1})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "temprature"


def test_echo_with_logprobs_and_max_tokens_zero(client):
    prompt = ENC("abc")
    r = client.post("/v1/completions", json={"prompt": prompt, "echo": True, "logprobs": 1,
                                             "max_tokens": 0, "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    # The prompt's tokens, the first without a logprob (null), and nothing generated.
    assert choice["text"] == "abc" and choice["finish_reason"] == "length"
    assert len(lp["tokens"]) == len(prompt)
    assert lp["token_logprobs"] == [None, -1.0, -1.0, -1.0]
    # logprobs 1: the most likely token (here the actual one, rank 1) only.
    assert lp["top_logprobs"][0] is None and lp["top_logprobs"][1] == {"a": -1.0}
    # Offsets index the echoed text: the bos the tokenizer added is not in it (offset 0).
    assert lp["text_offset"] == [0, 0, 1, 2]
    assert [choice["text"][o] for o in lp["text_offset"][1:]] == lp["tokens"][1:]
    assert r.json()["usage"]["completion_tokens"] == 0
    # lm-eval's shape: max_tokens 1, the generated token last.
    r = client.post("/v1/completions", json={"prompt": prompt, "echo": True, "logprobs": 1,
                                             "max_tokens": 1, "temperature": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(prompt) + 1 and lp["token_logprobs"][-1] == -0.25
    gen_text = scripted_completion(prompt, 1)
    assert r.json()["choices"][0]["text"] == "abc" + gen_text
    assert lp["text_offset"] == [0, 0, 1, 2, 3]  # never decreasing into the generated part


def test_max_tokens_zero_needs_echo(client):
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_streamed_echo_with_logprobs(client):
    prompt = ENC("ab")
    chunks = sse(client.post("/v1/completions", json={
        "prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 2, "stream": True}))
    first = chunks[0]["choices"][0]
    assert first["text"] == "ab" and first["logprobs"]["token_logprobs"] == [None, -1.0, -1.0]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == "ab" + scripted_completion(prompt, 2)
    scored = sse(client.post("/v1/completions", json={
        "prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 0, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in scored) == "ab"
    assert scored[-1]["choices"][0]["finish_reason"] == "length"


def test_prompt_logprobs_extra(client):
    r = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 1,
                                             "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    plp = r.json()["choices"][0]["prompt_logprobs"]
    ids = ENC("ab")
    assert plp[0] is None and len(plp) == len(ids)
    assert plp[1][str(ids[1])] == {"logprob": -1.0, "rank": 1, "decoded_token": "a"}
    assert plp[1][str(ord("A") + 3)]["rank"] == 2 and len(plp[1]) == 2  # actual + top 2
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "q"}], "max_tokens": 1, "prompt_logprobs": 0})
    assert r.status_code == 200 and r.json()["prompt_logprobs"][0] is None
    assert all(len(p) == 1 for p in r.json()["prompt_logprobs"][1:])
    r = client.post("/v1/completions", json={"prompt": "ab", "stream": True, "prompt_logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


def test_return_tokens_as_token_ids(client):
    r = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "logprobs": 1,
                                             "return_tokens_as_token_ids": True})
    lp = r.json()["choices"][0]["logprobs"]
    assert all(t.startswith("token_id:") for t in lp["tokens"])
    assert all(k.startswith("token_id:") for top in lp["top_logprobs"] for k in top)
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "q"}], "max_tokens": 2, "logprobs": True,
        "top_logprobs": 1, "return_tokens_as_token_ids": True})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert all(c["token"].startswith("token_id:") for c in content)


def test_truncate_prompt_tokens_and_add_special_tokens(client):
    long = "abcdefghij"
    r = client.post("/v1/completions", json={"prompt": long, "max_tokens": 1,
                                             "truncate_prompt_tokens": 4, "echo": True})
    assert r.json()["usage"]["prompt_tokens"] == 4
    assert r.json()["choices"][0]["text"].startswith("ghij")
    r = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 1,
                                             "add_special_tokens": False})
    assert r.json()["usage"]["prompt_tokens"] == 2  # no bos


def test_chat_extras(client, server):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello wor"}]
    r = client.post("/tokenize", json={"messages": msgs, "add_generation_prompt": False,
                                       "continue_final_message": True})
    text = client.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]
    assert text.endswith("Hello wor")
    r = client.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 2, "add_generation_prompt": False,
        "continue_final_message": True, "chat_template_kwargs": {"enable_thinking": False},
        "add_special_tokens": False})
    assert r.status_code == 200, r.text
    r = client.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 2, "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_chat_template_kwargs_may_name_the_reserved_variables(client):
    """vLLM lets chat_template_kwargs set add_generation_prompt (it wins over the field); messages,
    bos_token and eos_token are the server's. Each used to be a TypeError and a 500."""
    msgs = [{"role": "user", "content": "hi"}]

    def prompt(**body):
        r = client.post("/tokenize", json={"messages": msgs, **body})
        assert r.status_code == 200, r.text
        return client.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]

    with_header = prompt()
    without = prompt(add_generation_prompt=False)
    assert with_header != without
    assert prompt(chat_template_kwargs={"add_generation_prompt": False}) == without
    assert prompt(add_generation_prompt=False,
                  chat_template_kwargs={"add_generation_prompt": True}) == with_header
    assert prompt(chat_template_kwargs={"messages": [], "bos_token": "X", "eos_token": "Y"}) \
        == with_header
    r = client.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 1, "chat_template_kwargs": {"add_generation_prompt": False,
                                                                    "messages": []}})
    assert r.status_code == 200, r.text
    r = client.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 1, "chat_template_kwargs": {"add_generation_prompt": "no"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
    assert "add_generation_prompt must be true or false" in r.json()["error"]["message"]


def test_sampling_errors_name_the_field_as_param(client):
    for sparse, param in (({"strategy": "dilated", "density": 5}, "sparse_attention.density"),
                          ({"strategy": "bogus"}, "sparse_attention.strategy")):
        r = client.post("/v1/completions", json={"prompt": "x", "sparse_attention": sparse})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "SamplingParams" not in r.text


def test_use_beam_search_refuses_per_token_logprobs(client):
    r = client.post("/v1/completions", json={"prompt": "x", "use_beam_search": True, "n": 2,
                                             "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1,
                                             "use_beam_search": False})
    assert r.status_code == 200


@pytest.mark.parametrize("field,value", [
    ("stop", "\n"), ("stop", ["a"]), ("stop_token_ids", [3]), ("min_tokens", 2),
    ("presence_penalty", 0.5), ("frequency_penalty", -1.0), ("repetition_penalty", 1.2),
    ("top_p", 0.9), ("top_k", 5), ("min_p", 0.1), ("sparse_attention", {"strategy": "streaming"})])
def test_use_beam_search_refuses_what_it_would_ignore(client, field, value):
    """Beam search stops at EOS or max_tokens and ranks by logprob: a stop string or a penalty
    it would silently drop is a 400 naming the field (they used to be ignored)."""
    body = {"prompt": "x", "use_beam_search": True, "n": 2, "max_tokens": 2}
    r = client.post("/v1/completions", json={**body, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and "use_beam_search" in r.json()["error"]["message"]


def test_models_do_not_expose_the_path(client):
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == "scripted" and card["root"] == "scripted"
    assert "/srv/secret" not in client.get("/v1/models").text


def test_utility_routes(client):
    from pagedllm import __version__

    assert client.get("/version").json() == {"version": __version__}
    assert client.get("/ping").status_code == 200 and client.post("/ping").status_code == 200
    info = client.get("/tokenizer_info").json()
    assert info["vocab_size"] == 259 and info["eos_token_ids"] == [2]
    assert "eos_token" in info and info["chat_template"]


def test_cors_is_off_by_default(client):
    r = client.options("/v1/completions", headers={
        "Origin": "https://ui.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_preflight_and_response_headers():
    settings = ServerSettings(allowed_origins=["https://ui.example"], api_key="k")
    with ServerThread(create_app(ScriptedEngine(), settings)) as s:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            r = c.options("/v1/chat/completions", headers={
                "Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"})
            assert r.status_code == 200
            assert r.headers["access-control-allow-origin"] == "https://ui.example"
            assert "POST" in r.headers["access-control-allow-methods"]
            assert "authorization" in r.headers["access-control-allow-headers"].lower()
            r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "bar": 1},
                       headers={"Origin": "https://ui.example", "Authorization": "Bearer k"})
            assert r.status_code == 200
            assert r.headers["access-control-allow-origin"] == "https://ui.example"
            assert "x-ignored-fields" in r.headers["access-control-expose-headers"].lower()
            r = c.options("/v1/completions", headers={
                "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
            assert r.headers.get("access-control-allow-origin") != "https://evil.example"


def test_large_prompts_are_tokenized_off_the_event_loop(client):
    """A long prompt is tokenized (a chat rendered) on a worker thread, so the loop keeps
    serving /health and the streams meanwhile; the result is the same as inline."""
    import asyncio
    import threading

    from pagedllm.server.state import OFF_LOOP_CHARS, off_loop_if_large

    async def where(size):
        loop_thread = threading.get_ident()
        ran = await off_loop_if_large(size, threading.get_ident)
        return ran != loop_thread

    assert asyncio.run(where(OFF_LOOP_CHARS)) is True
    assert asyncio.run(where(OFF_LOOP_CHARS - 1)) is False
    # End to end: a prompt over the threshold (truncated to the model's length) still runs.
    big = "ab" * OFF_LOOP_CHARS
    for route, body in (("/v1/completions", {"prompt": big}),
                        ("/v1/chat/completions", {"messages": [{"role": "user",
                                                                "content": big}]})):
        r = client.post(route, json={**body, "max_tokens": 2, "truncate_prompt_tokens": 100})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 100
