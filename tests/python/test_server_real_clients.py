"""The openai client on the real engine (tiny random-weight Llama) doing what real clients do
(issue 20): echo with logprobs and max_tokens 0 (lm-eval's scoring), prompt_logprobs, the
guidellm streaming request, hostile values, and tenant isolation of the prefix cache."""

import json

import httpx
import openai
import pytest

from pagedllm.server import ServerSettings
from server_fixtures import serve_tiny_model, write_tiny_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = write_tiny_model(tmp_path_factory.mktemp("tiny"))
    settings = ServerSettings(served_model_name="tiny", max_tokens_limit=64,
                              api_key="key-a", cache_salt_by_api_key=False)
    with serve_tiny_model(model_dir, settings, num_kv_blocks=128, max_model_len=256,
                          block_size=16) as s:
        s.model_dir = model_dir
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="key-a", max_retries=0)


AUTH = {"Authorization": "Bearer key-a"}


def tokenize(server, text):
    return httpx.post(server.url + "/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]


def test_echo_logprobs_agree_with_generation(server, client):
    ctx = tokenize(server, "the quick brown fox")
    as_ids = {"return_tokens_as_token_ids": True}
    gen = client.completions.create(model="tiny", prompt=ctx, max_tokens=1, temperature=0,
                                    logprobs=2, extra_body={"ignore_eos": True, **as_ids})
    g_lp = gen.choices[0].logprobs
    g_id = int(g_lp.tokens[0].split(":")[1])
    # Score context + the greedy token: its echoed logprob is the one generation reported.
    scored = client.completions.create(model="tiny", prompt=ctx + [g_id], max_tokens=0,
                                       echo=True, logprobs=2, temperature=0, extra_body=as_ids)
    lp = scored.choices[0].logprobs
    assert lp.tokens == [f"token_id:{t}" for t in ctx + [g_id]]
    assert len(lp.token_logprobs) == len(ctx) + 1 and lp.token_logprobs[0] is None
    assert lp.token_logprobs[-1] == pytest.approx(g_lp.token_logprobs[0], abs=1e-4)
    assert lp.top_logprobs[-1] == pytest.approx(g_lp.top_logprobs[0], abs=1e-4)
    # Greedy: the scored token is the most likely at its position.
    assert lp.token_logprobs[-1] == pytest.approx(max(lp.top_logprobs[-1].values()), abs=1e-6)
    assert scored.choices[0].finish_reason == "length" and scored.usage.completion_tokens == 0
    assert all(v <= 0 for v in lp.token_logprobs[1:])


def test_prompt_logprobs_field_matches_echo(server):
    body = {"model": "tiny", "prompt": "hello world, hello there", "max_tokens": 1,
            "echo": True, "logprobs": 1, "prompt_logprobs": 1, "temperature": 0}
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, json=body, timeout=30)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    ids = tokenize(server, body["prompt"])
    plp = choice["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    echoed = choice["logprobs"]["token_logprobs"][:len(ids)]
    for i in range(1, len(ids)):
        assert plp[i][str(ids[i])]["logprob"] == pytest.approx(echoed[i], abs=1e-6)


def test_guidellm_streaming_request_shape(server):
    # The bodies guidellm 0.8.1 sends for a fixed-length benchmark (TextCompletionsRequestHandler
    # and ChatCompletionsRequestHandler.format in guidellm/backends/openai/request_handlers.py).
    # guidellm itself is not installed: it pulls sanic, uvloop and pins of multidict and
    # websockets that would change the shared test environment.
    body = {"model": "tiny", "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_tokens": 6, "stop": None, "ignore_eos": True,
            "prompt": "once upon a time there was"}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH,
                      timeout=60) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(c["usage"] for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    chat = {"model": "tiny", "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_completion_tokens": 5, "stop": None, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.url + "/v1/chat/completions", json=chat, headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    last = json.loads(r.text.split("\n\n")[-3][6:])
    assert last["usage"]["completion_tokens"] == 5


def test_hostile_values_leave_the_engine_healthy(server, client):
    bad = [{"top_k": 2 ** 63}, {"seed": 2 ** 64}, {"n": 10 ** 6}, {"logprobs": 10 ** 9},
           {"temperature": 1e300}, {"repetition_penalty": 1e300}]
    for extra in bad:
        r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=30,
                       json={"prompt": "x", "max_tokens": 2, **extra})
        assert r.status_code == 400, (extra, r.text)
    # Extreme but valid values run (temperature 1e-45 is greedy, penalties stay finite).
    greedy = client.completions.create(model="tiny", prompt="the quick", max_tokens=8,
                                       temperature=0, extra_body={"ignore_eos": True})
    tiny = client.completions.create(model="tiny", prompt="the quick", max_tokens=8,
                                     temperature=1e-45, extra_body={"ignore_eos": True,
                                                                    "top_k": 2 ** 31 - 1})
    assert tiny.choices[0].text == greedy.choices[0].text
    out = client.completions.create(model="tiny", prompt="the quick", max_tokens=8, seed=1,
                                    extra_body={"repetition_penalty": 100.0, "min_p": 1.0,
                                                "ignore_eos": True}, frequency_penalty=2.0)
    assert out.usage.completion_tokens == 8
    assert httpx.get(server.url + "/health").status_code == 200


def test_cache_salt_isolates_the_prefix_cache(server, client):
    prompt = "a block table maps each sequence to its physical blocks " * 3

    def hits_after(**extra):
        before = scrape_auth(server)["pagedllm:prefix_cache_hits_total"]
        client.completions.create(model="tiny", prompt=prompt, max_tokens=1, extra_body=extra)
        return scrape_auth(server)["pagedllm:prefix_cache_hits_total"] - before

    hits_after(cache_salt="tenant-a")                      # fills tenant a's cache
    assert hits_after(cache_salt="tenant-a") > 0           # a hits its own blocks
    assert hits_after(cache_salt="tenant-b") == 0          # b never sees them
    assert hits_after() == 0                               # nor does the shared namespace


def scrape_auth(server):
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=30).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_metrics_need_the_key(server):
    assert httpx.get(server.url + "/metrics", timeout=30).status_code == 401


def test_use_beam_search_returns_the_engines_beams(server, client):
    from pagedllm import LLM
    from pagedllm.sampling_params import BeamSearchParams

    ids = tokenize(server, "the quick brown fox")
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=5, n=2,
                                  extra_body={"use_beam_search": True, "best_of": 3,
                                              "ignore_eos": True, "length_penalty": 1.0})
    assert [c.index for c in r.choices] == [0, 1]
    # The offline API's beam search on the same model ranks the same best beams.
    llm = LLM(server.model_dir, num_kv_blocks=128, block_size=16)
    (ref,) = llm.beam_search([{"prompt_token_ids": ids}],
                             BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True))
    assert [c.text for c in r.choices] == [b.text for b in ref.sequences[:2]]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                   "content": "hi"}],
                                          max_tokens=3, extra_body={"use_beam_search": True})
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_use_beam_search_takes_the_unset_values_and_extreme_penalties(server):
    """The values client libraries send for "unset" (defaults, null, empty lists) pass with
    use_beam_search; a length_penalty past the float range ranks the beams (it used to raise in
    the engine thread and stop the server for every request)."""
    body = {"prompt": "the quick", "use_beam_search": True, "n": 2, "max_tokens": 3,
            "stop": None, "stop_token_ids": [], "min_tokens": 0, "presence_penalty": 0,
            "frequency_penalty": 0.0, "repetition_penalty": 1, "top_p": 1, "top_k": -1,
            "min_p": 0, "logprobs": None, "echo": False, "seed": 3}
    for penalty in (1.0, -600.0, 1e308):
        r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=60,
                       json={**body, "length_penalty": penalty})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
