"""Hostile input (issue 20): out-of-range numbers, lone surrogates and oversized requests are
400s naming the field, never a 500 or a dead engine; cache_salt namespaces the prefix cache."""

import json

import httpx
import pytest

from pagedllm.server import ServerSettings, create_app
from pagedllm.server.cache_salt import cache_key
from server_fixtures import ScriptedEngine, ServerThread, client  # noqa: F401

SETTINGS = ServerSettings(max_tokens_limit=300, max_prompts_per_request=8,
                          max_sequences_per_request=16, max_logprobs_per_request=5000)


@pytest.fixture(scope="module")
def server():
    engine = ScriptedEngine(step_delay=0.001)
    with ServerThread(create_app(engine, SETTINGS)) as s:
        s.engine = engine
        yield s


def post_raw(client, path, body: str):
    """POST a JSON text as is (lone surrogates and NaN survive only as escapes/literals)."""
    return client.post(path, content=body.encode("ascii"),
                       headers={"Content-Type": "application/json"})


def assert_healthy(client):
    assert client.get("/health").status_code == 200
    r = client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2})
    assert r.status_code == 200, r.text


BIG = 2 ** 63


@pytest.mark.parametrize("field,value", [
    ("top_k", BIG), ("top_k", 2 ** 31), ("top_k", -2), ("n", 0), ("n", BIG), ("n", 129),
    ("best_of", BIG), ("seed", -1), ("seed", BIG), ("seed", 2 ** 64), ("max_tokens", BIG),
    ("max_tokens", -1), ("min_tokens", BIG), ("logprobs", 21), ("logprobs", -1),
    ("prompt_logprobs", 21), ("temperature", -0.5), ("temperature", 1e300), ("top_p", 0),
    ("min_p", 2), ("presence_penalty", 1e300), ("frequency_penalty", -3),
    ("repetition_penalty", 0), ("repetition_penalty", 1e300), ("stop_token_ids", [BIG]),
    ("truncate_prompt_tokens", BIG), ("truncate_prompt_tokens", -2),
])
def test_out_of_range_numbers_are_400_naming_the_field(client, field, value):
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, field: value}
                    if field != "max_tokens" else {"prompt": "x", field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == field
    assert field in r.json()["error"]["message"]
    assert_healthy(client)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty",
                                   "frequency_penalty", "repetition_penalty", "min_p",
                                   "length_penalty"])
def test_non_finite_floats_are_400(client, field, literal):
    r = post_raw(client, "/v1/completions",
                 f'{{"prompt": "x", "max_tokens": 2, "{field}": {literal}}}')
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_chat_numeric_fields_are_checked_too(client):
    msgs = [{"role": "user", "content": "x"}]
    for field, value in [("top_logprobs", 21), ("top_k", BIG), ("max_completion_tokens", BIG),
                         ("seed", BIG), ("n", 0)]:
        r = client.post("/v1/chat/completions", json={"messages": msgs, field: value,
                                                      "logprobs": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    assert_healthy(client)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", '{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff"]}', "prompt.1"),
    ("/v1/completions", '{"prompt": "ok", "echo": true, "stop": ["\\ud83d"]}', "stop.0"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}',
     "messages.0.content"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "x\\udc00"}]}]}',
     "messages.0.content.0.text"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], '
     '"\\ud800key": 1}', "\\ud800key"),  # the param quotes the key escaped
    ("/tokenize", '{"prompt": "\\ud800"}', "prompt"),
    ("/tokenize", '{"messages": [{"role": "user", "content": "\\ud800"}]}',
     "messages.0.content"),
])
def test_lone_surrogates_are_400_naming_the_field(client, path, body, param):
    r = post_raw(client, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "lone surrogate" in err["message"]
    assert_healthy(client)


def test_a_valid_surrogate_pair_is_fine(client):
    r = post_raw(client, "/v1/completions", '{"prompt": "emoji \\ud83d\\ude00", "echo": true, '
                 '"max_tokens": 1}')
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("emoji \U0001F600")


def test_request_size_limits(client):
    r = client.post("/v1/completions", json={"prompt": ["x"] * 9, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert "at most 8 prompts" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": ["x"] * 4, "n": 5, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert "20 sequences" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": "x", "n": 2, "best_of": 17,
                                             "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = client.post("/v1/completions", json={"prompt": "x", "n": 4, "logprobs": 20,
                                             "max_tokens": 100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "n": 16, "logprobs": True,
        "top_logprobs": 20, "max_tokens": 100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = client.post("/v1/completions", json={"prompt": ["x"] * 8, "n": 2, "max_tokens": 1})
    assert r.status_code == 200  # 16 sequences: at the limit
    assert_healthy(client)


def test_settings_validate_limits():
    with pytest.raises(ValueError, match="max_sequences_per_request"):
        ServerSettings(max_sequences_per_request=0)
    assert ServerSettings(allowed_origins="https://a, https://b").allowed_origins == (
        "https://a", "https://b")


def test_cache_salt_sets_the_prefix_cache_namespace(server, client):
    def key_of(extra_headers=None, **body):
        before = set(server.engine.extra_keys)
        r = client.post("/v1/completions", headers=extra_headers or {},
                        json={"prompt": "same prompt", "max_tokens": 1, **body})
        assert r.status_code == 200, r.text
        (rid,) = set(server.engine.extra_keys) - before
        return server.engine.extra_keys[rid]

    assert key_of() == 0
    a, b = key_of(cache_salt="tenant-a"), key_of(cache_salt="tenant-b")
    assert a != 0 and b != 0 and a != b and key_of(cache_salt="tenant-a") == a
    # Without salting by key the bearer token does not matter.
    assert key_of({"Authorization": "Bearer one"}) == 0


def test_cache_salt_by_api_key():
    engine = ScriptedEngine()
    settings = ServerSettings(cache_salt_by_api_key=True)
    with ServerThread(create_app(engine, settings)) as s, httpx.Client(base_url=s.url,
                                                                        timeout=30) as c:
        keys = []
        for headers, salt in [({"Authorization": "Bearer alice"}, None),
                              ({"Authorization": "Bearer bob"}, None),
                              ({"Authorization": "Bearer alice"}, None),
                              ({"Authorization": "Bearer alice"}, "x"), ({}, None)]:
            body = {"prompt": "p", "max_tokens": 1, **({"cache_salt": salt} if salt else {})}
            before = set(engine.extra_keys)
            assert c.post("/v1/completions", json=body, headers=headers).status_code == 200
            (rid,) = set(engine.extra_keys) - before
            keys.append(engine.extra_keys[rid])
        alice, bob, alice2, alice_x, anonymous = keys
        assert alice == alice2 and alice != bob and alice_x not in (alice, bob)
        assert anonymous == 0 and 0 not in (alice, bob, alice_x)


def test_cache_key_is_a_63_bit_hash_of_both_parts():
    assert cache_key(None, None) == 0
    keys = {cache_key("s", None), cache_key(None, "s"), cache_key("s", "t"), cache_key("t", "s")}
    assert len(keys) == 4 and all(0 < k < 2 ** 63 for k in keys)


def test_the_body_size_limit_still_holds(client):
    r = client.post("/v1/completions", json={"prompt": "x" * (2 << 20)})
    assert r.status_code == 413


def test_detokenize_and_tokenize_hostile_values(client):
    r = client.post("/detokenize", json={"tokens": [BIG]})
    assert r.status_code == 400
    r = client.post("/v1/completions", json={"prompt": [[1, 2], [BIG]], "max_tokens": 1})
    # The error names the bad token id, not pydantic's Union member tags.
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt.1.0"
    assert "less than or equal to 2147483647" in r.json()["error"]["message"]
    r = post_raw(client, "/v1/completions", json.dumps({"prompt": [1, 2], "max_tokens": 1,
                                                        "stop_token_ids": list(range(65))}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids"
    assert_healthy(client)


def test_the_issue_s_monopolising_requests_are_refused_by_default():
    # Defect 4's requests, against the default limits: 4000 prompts x n=16 in a 44 KB body,
    # and n=128 with logprobs=20 over 1000 tokens.
    with ServerThread(create_app(ScriptedEngine())) as s, httpx.Client(base_url=s.url,
                                                                        timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": ["hi x"] * 4000, "n": 16, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = c.post("/v1/completions", json={"prompt": "hi", "n": 128, "logprobs": 20,
                                            "max_tokens": 1000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
        assert c.get("/health").status_code == 200
