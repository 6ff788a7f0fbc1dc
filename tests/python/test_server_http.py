"""The HTTP layer over a real socket, with ScriptedEngine behind it: SSE framing, stop strings
while streaming, n and multiple prompts, auth, error shapes and codes, limits, disconnects."""

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pagedllm.server import ServerSettings, create_app
from server_fixtures import ScriptedEngine, ServerThread, client, scripted_completion  # noqa: F401

ENC = ScriptedEngine().tokenizer.encode


@pytest.fixture(scope="module")
def server():
    engine = ScriptedEngine(step_delay=0.001)
    settings = ServerSettings(max_tokens_limit=300, max_request_bytes=4096)
    with ServerThread(create_app(engine, settings)) as s:
        s.engine = engine
        yield s


def events(response):
    """The data payloads of an SSE response, checking the framing on the way."""
    body = response.text
    assert body.endswith("data: [DONE]\n\n")
    chunks = body.split("\n\n")
    assert chunks[-1] == ""
    payloads = []
    for c in chunks[:-1]:
        assert c.startswith("data: "), c
        payloads.append(c[len("data: "):])
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def metric(client, name, **labels):
    """The value of one sample of /metrics (0 for a labelled counter not yet incremented)."""
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    if labels:
        return 0.0
    raise AssertionError(f"{name} not in /metrics")


def test_completion_whole_and_streamed_agree(client):
    body = {"prompt": "hello", "max_tokens": 12}
    whole = client.post("/v1/completions", json=body).json()
    assert whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == scripted_completion(ENC("hello"), 12)
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"] == {"prompt_tokens": 6, "completion_tokens": 12, "total_tokens": 18}
    chunks = events(client.post("/v1/completions", json={**body, "stream": True}))
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"


def test_stop_string_is_never_streamed(client):
    full = scripted_completion(ENC("hi"), 40)
    stop = full[15:19]
    expected = full[: full.index(stop)]
    body = {"prompt": "hi", "max_tokens": 40, "stop": [stop]}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    assert (whole["text"], whole["finish_reason"], whole["stop_reason"]) == (expected, "stop", stop)
    chunks = events(client.post("/v1/completions", json={**body, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    chat = events(client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stop": stop,
        "stream": True}))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chat)
    assert stop not in text


def test_n_and_several_prompts_number_the_choices(client):
    r = client.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2, "max_tokens": 4,
                                              "temperature": 1.0}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert r["choices"][0]["text"] != r["choices"][1]["text"]  # distinct samples
    assert r["usage"]["completion_tokens"] == 16
    chunks = events(client.post("/v1/completions", json={"prompt": [[1, 70], [1, 71]], "n": 2,
                                                          "max_tokens": 3, "stream": True}))
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1, 2, 3}


def test_chat_stream_opens_with_role_and_ends_with_usage(client):
    chunks = events(client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "n": 2, "stream": True,
        "stream_options": {"include_usage": True}}))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    firsts = chunks[:2]
    assert [c["choices"][0]["delta"] for c in firsts] == [{"role": "assistant", "content": ""}] * 2
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    prompt_ids = ENC("user: hi\nassistant:")
    assert chunks[-1]["usage"]["prompt_tokens"] == len(prompt_ids)
    text0 = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[2:-1]
                    if c["choices"][0]["index"] == 0)
    assert text0 == scripted_completion(prompt_ids, 5)


def test_logprobs_in_both_apis(client):
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "logprobs": 2}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "logprobs": True,
        "top_logprobs": 2}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and all(len(t["top_logprobs"]) == 2 for t in content)


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 301}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": 3}, 400, "temperature"),
    ({"prompt": "x", "n": 2, "best_of": 1}, 400, "best_of"),
    ({"prompt": "x", "stream": True, "n": 1, "best_of": 2}, 400, "best_of"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": "x", "logit_bias": {"1": 5}}, 400, "logit_bias"),
    ({"prompt": "x" * 300, "max_tokens": 300}, 400, "prompt"),   # longer than max_model_len
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ({"max_tokens": 3}, 400, "prompt"),
])
def test_bad_completion_requests(client, body, status, param):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


def test_bad_bodies_and_routes(client):
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = client.post("/v1/completions", json={"prompt": "x" * 5000})
    assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"]
    r = client.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = client.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_models_tokenize_detokenize_health(client):
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "scripted" and models["data"][0]["max_model_len"] == 512
    tok = client.post("/tokenize", json={"prompt": "hi"}).json()
    assert tok == {"count": 3, "max_model_len": 512, "tokens": ENC("hi")}
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == ENC("user: hi\nassistant:")
    assert client.post("/detokenize", json={"tokens": ENC("hi")}).json() == {"prompt": "hi"}
    r = client.post("/detokenize", json={"tokens": [100000]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    r = client.post("/tokenize", json={"prompt": "a", "messages": []})
    assert r.status_code == 400
    assert client.get("/health").status_code == 200


def test_client_leaving_mid_stream_aborts_and_frees(server, client):
    before = metric(client, "pagedllm:request_success_total", finished_reason="abort")
    with httpx.Client(base_url=server.url, timeout=30) as c:
        with c.stream("POST", "/v1/completions",
                      json={"prompt": "long", "max_tokens": 300, "stream": True}) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(3)]
            assert got[0].startswith("data: ")
    _wait(lambda: not server.engine.requests)
    _wait(lambda: metric(client, "pagedllm:request_success_total", finished_reason="abort") == before + 1)
    assert metric(client, "pagedllm:num_requests_running") == 0
    assert metric(client, "pagedllm:kv_cache_used_blocks") == 0


def test_client_leaving_before_a_whole_answer_aborts(server, client):
    before = metric(client, "pagedllm:request_success_total", finished_reason="abort")
    with httpx.Client(base_url=server.url, timeout=0.05) as c:
        with pytest.raises(httpx.TimeoutException):
            c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                 "max_tokens": 300})
    _wait(lambda: not server.engine.requests)
    assert metric(client, "pagedllm:request_success_total", finished_reason="abort") == before + 1


def test_api_key_guards_v1_and_metrics():
    with ServerThread(create_app(ScriptedEngine(), ServerSettings(api_key="sekret"))) as s:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            r = c.get("/v1/models")
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert r.headers["www-authenticate"] == "Bearer"
            assert "missing API key" in r.json()["error"]["message"]
            for header in ("sekret", "Basic sekret", "Bearer"):  # the key, but not as Bearer
                r = c.get("/v1/models", headers={"Authorization": header})
                assert r.status_code == 401 and "malformed Authorization header" in r.text, header
            r = c.post("/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401 and "incorrect" in r.json()["error"]["message"]
            r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                       headers={"Authorization": "Bearer sekret"})
            assert r.status_code == 200
            assert c.get("/health").status_code == 200
            assert c.head("/health").status_code == 200 and c.head("/ping").status_code == 200
            # /metrics tells about other clients' prompts (prefix-cache hits): behind the key.
            assert c.get("/metrics").status_code == 401
            assert c.get("/metrics", headers={"Authorization": "Bearer sekret"}).status_code == 200
    public = ServerSettings(api_key="sekret", metrics_public=True)
    with ServerThread(create_app(ScriptedEngine(), public)) as s:
        assert httpx.get(s.url + "/metrics", timeout=30).status_code == 200


def test_dead_engine_answers_503():
    engine = ScriptedEngine()
    with ServerThread(create_app(engine)) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        engine.fail_next_step = True
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 503 and "scripted failure" in r.json()["error"]["message"]
        assert c.get("/health").status_code == 503
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 503


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.mark.parametrize("content,headers,message", [
    (b'{"prompt": "x"}', {}, "not read as JSON: send a JSON object with the header "
                             "'Content-Type: application/json'"),
    (b"", {"content-type": "application/json"}, "the request body is empty"),
    (b"\xff\xfe", {"content-type": "application/json"}, "the body is not valid JSON"),
    (b"[1, 2]", {"content-type": "application/json"}, "must be a JSON object, got a JSON array"),
    (b'"hi"', {"content-type": "application/json"}, "must be a JSON object, got a JSON string"),
])
def test_a_body_that_is_not_a_json_object_says_what_to_send(client, content, headers, message):
    r = client.post("/v1/completions", content=content, headers=headers)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
