"""A bounded fuzzing pass over the HTTP API (issue 20), on the real engine (tiny random-weight
Llama): request bodies built by hypothesis from the fields the app's own OpenAPI schema lists,
each field given plausible values or hostile ones (huge and negative integers, NaN and
infinities, lone surrogates, wrong types, nulls). No answer may be a 500, every error has
OpenAI's shape, and afterwards the engine is healthy with no KV block held.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from starlette.testclient import TestClient

from pagedllm.server import ServerSettings, create_app
from server_fixtures import write_tiny_model

pytestmark = pytest.mark.slow

EXAMPLES = 120  # per route; the whole file stays well under a minute

HOSTILE = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.sampled_from([0, -1, 1, 2, 20, 21, 128, 129, 2 ** 31 - 1, 2 ** 31, 2 ** 63 - 1, 2 ** 63,
                     2 ** 64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-45, 1e-5, 5e-324, 1e308, -0.0]),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "</s>", "<s>"]),
    st.lists(st.integers(min_value=-5, max_value=2 ** 40), max_size=4),
    st.lists(st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def plausible(name: str):
    """Values a client would send for a field (so requests get past validation too)."""
    table = {
        "max_tokens": st.integers(0, 6), "max_completion_tokens": st.integers(1, 6),
        "n": st.integers(1, 3), "best_of": st.integers(1, 3), "logprobs": st.integers(0, 5),
        "top_logprobs": st.integers(0, 5), "prompt_logprobs": st.integers(0, 3),
        "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 50),
        "min_p": st.floats(0, 1), "seed": st.integers(0, 2 ** 63 - 1),
        "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
        "repetition_penalty": st.floats(0.01, 100), "min_tokens": st.integers(0, 3),
        "stop": st.one_of(st.text(min_size=1, max_size=3),
                          st.lists(st.text(min_size=1, max_size=3), max_size=3)),
        "stop_token_ids": st.lists(st.integers(0, 600), max_size=3),
        "truncate_prompt_tokens": st.integers(-1, 8), "cache_salt": st.text(min_size=1, max_size=6),
        "echo": st.booleans(), "stream": st.booleans(), "logit_bias": st.just({}),
        "stream_options": st.fixed_dictionaries({}, optional={
            "include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}),
    }
    return table.get(name, HOSTILE)


BOOLEAN_FIELDS = {"echo", "stream", "ignore_eos", "skip_special_tokens", "add_special_tokens",
                  "include_stop_str_in_output", "return_tokens_as_token_ids",
                  "add_generation_prompt", "continue_final_message", "use_beam_search"}


@st.composite
def body_strategy(draw, schema: dict, required: dict):
    """A body with the required fields and up to 5 others from the schema, each plausible
    four times in five and hostile otherwise (so requests get through to the engine too)."""
    names = sorted(n for n in schema["properties"] if n not in required)
    body = {k: draw(v) for k, v in required.items()}
    for name in draw(st.lists(st.sampled_from(names), max_size=5, unique=True)):
        if name in BOOLEAN_FIELDS:
            good = st.booleans()
        elif name == "model":
            good = st.none()
        else:
            good = plausible(name)
        body[name] = draw(HOSTILE if draw(st.integers(0, 4)) == 0 else good)
    return body


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from pagedllm.config import EngineConfig
    from pagedllm.engine.llm_engine import LLMEngine

    model_dir = write_tiny_model(tmp_path_factory.mktemp("tiny"), max_position_embeddings=128)
    engine = LLMEngine(EngineConfig(model=model_dir, num_threads=1, num_kv_blocks=64,
                                    block_size=16))
    app = create_app(engine, ServerSettings(max_tokens_limit=16, max_sequences_per_request=6,
                                            max_prompts_per_request=4,
                                            max_logprobs_per_request=2000))
    with TestClient(app, raise_server_exceptions=False) as c:
        c.schemas = app.openapi()["components"]["schemas"]
        yield c
        # Afterwards: healthy, still answering, nothing held.
        assert c.get("/health").status_code == 200
        r = c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert app.state.server.engine.stats()["used_blocks"] == 0


STATUSES = []


def check(response) -> None:
    STATUSES.append(response.status_code)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        err = response.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] and "param" in err


def send(client, path: str, body) -> None:
    data = json.dumps(body, allow_nan=True, ensure_ascii=True)  # NaN literals, \\ud800 escapes
    check(client.post(path, content=data, headers={"Content-Type": "application/json"}))


PROMPTS = st.one_of(st.text(min_size=1, max_size=12), st.lists(st.integers(-3, 700), max_size=6),
                    st.lists(st.text(max_size=6), max_size=3),
                    st.lists(st.lists(st.integers(0, 600), max_size=4), max_size=2), HOSTILE)
MESSAGES = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant",
                                                             "bogus"]),
                                    "content": st.one_of(st.text(max_size=10), HOSTILE)}),
             min_size=1, max_size=3),
    HOSTILE)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


@FUZZ
@given(data=st.data())
def test_fuzz_completions(client, data):
    schema = client.schemas["CompletionRequest"]
    send(client, "/v1/completions", data.draw(body_strategy(schema, {"prompt": PROMPTS})))


@FUZZ
@given(data=st.data())
def test_fuzz_chat_completions(client, data):
    schema = client.schemas["ChatCompletionRequest"]
    send(client, "/v1/chat/completions", data.draw(body_strategy(schema, {"messages": MESSAGES})))


@FUZZ
@given(body=st.one_of(st.fixed_dictionaries({}, optional={
    "prompt": st.one_of(st.text(max_size=10), HOSTILE), "messages": MESSAGES,
    "add_special_tokens": HOSTILE, "model": HOSTILE}), HOSTILE), tokens=HOSTILE)
def test_fuzz_tokenize_and_detokenize(client, body, tokens):
    send(client, "/tokenize", body)
    send(client, "/detokenize", {"tokens": tokens})


def test_the_fuzzer_reached_the_engine():
    # Runs after the fuzz tests (file order): a pass that only ever got 400s would prove little.
    assert STATUSES.count(200) >= 20 and STATUSES.count(400) >= 20, {s: STATUSES.count(s) for s in set(STATUSES)}
