"""The official openai client against the server on a tiny random-weight Llama (real engine):
completions and chat, streamed and whole, n > 1, stop sequences, logprobs, auth, bad requests."""

import openai
import pytest

from pagedllm.server import ServerSettings
from server_fixtures import serve_tiny_model, write_tiny_model

KEY = "test-key"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def server(model_dir):
    settings = ServerSettings(served_model_name="tiny", max_tokens_limit=64)
    with serve_tiny_model(model_dir, settings, num_kv_blocks=128, max_model_len=256) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


# Random weights may pick EOS at any point; exact lengths need it ignored (a vLLM extension).
NO_EOS = {"extra_body": {"ignore_eos": True}}


def greedy(client, prompt, **kw):
    return client.completions.create(model="tiny", prompt=prompt, temperature=0, **NO_EOS, **kw)


def test_models(client):
    (card,) = client.models.list().data
    assert card.id == "tiny"


def test_completion_streamed_equals_whole(client):
    whole = greedy(client, "the quick brown", max_tokens=20)
    choice = whole.choices[0]
    assert whole.usage.completion_tokens == 20 and choice.finish_reason == "length"
    stream = greedy(client, "the quick brown", max_tokens=20, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_streamed_equals_whole(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    whole = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=16,
                                           temperature=0, **NO_EOS)
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=16,
                                            temperature=0, stream=True, **NO_EOS,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_n_choices_seeded_are_reproducible_streamed_or_not(client):
    kw = dict(model="tiny", prompt="once upon a time", max_tokens=12, n=3, temperature=1.0, seed=7)
    whole = client.completions.create(**kw)
    assert sorted(c.index for c in whole.choices) == [0, 1, 2]
    assert 3 <= whole.usage.completion_tokens <= 3 * 12
    texts = {c.index: c.text for c in whole.choices}
    assert len(set(texts.values())) > 1
    streamed = {i: "" for i in range(3)}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == texts


def _stop_candidate(text):
    # A 3-character printable substring whose first occurrence is past the start.
    for i in range(4, len(text) - 3):
        s = text[i:i + 3]
        if s.isprintable() and "\ufffd" not in s and text.find(s) == i:
            return i, s
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_sequences(client):
    full = greedy(client, "hello there", max_tokens=40).choices[0].text
    at, stop = _stop_candidate(full)
    got = greedy(client, "hello there", max_tokens=40, stop=[stop, "\x00never"]).choices[0]
    assert (got.text, got.finish_reason) == (full[:at], "stop")
    streamed = "".join(c.choices[0].text for c in
                       greedy(client, "hello there", max_tokens=40, stop=stop, stream=True))
    assert streamed == full[:at]
    chat_full = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=40,
        temperature=0, **NO_EOS).choices[0].message.content
    at, stop = _stop_candidate(chat_full)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=40,
        temperature=0, stop=stop, stream=True, **NO_EOS)
    assert "".join(c.choices[0].delta.content or "" for c in chat) == chat_full[:at]


def test_logprobs(client):
    r = greedy(client, "the lazy dog", max_tokens=5, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    # Up to 3 alternatives (tokens with the same text share an entry); greedy: the chosen
    # token is the most likely one.
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert all(lp.token_logprobs[i] == max(lp.top_logprobs[i].values()) for i in range(5))
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                                       **NO_EOS)
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 2 for t in content)


def test_bad_requests(client):
    with pytest.raises(openai.BadRequestError, match="at most 64"):
        greedy(client, "x", max_tokens=65)
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        greedy(client, "hello " * 200, max_tokens=60)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="x", temperature=-1)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        greedy(client, [1, 99999], max_tokens=2)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       tools=[{"type": "function", "function": {"name": "f"}}])
    # The server is fine afterwards.
    assert greedy(client, "x", max_tokens=2).usage.completion_tokens >= 1


def test_api_key_on_and_off(model_dir):
    with serve_tiny_model(model_dir, ServerSettings(api_key=KEY), num_kv_blocks=32) as s:
        good = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0)
        assert good.completions.create(model=good.models.list().data[0].id, prompt="x",
                                       max_tokens=2).choices
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        with pytest.raises(openai.AuthenticationError):
            list(bad.completions.create(model="x", prompt="x", stream=True))
    # Without a key configured, any key (or none) is accepted.
    with serve_tiny_model(model_dir, None, num_kv_blocks=32) as s:
        anyone = openai.OpenAI(base_url=s.url + "/v1", api_key="whatever", max_retries=0)
        assert anyone.models.list().data


def test_bundled_model_chat_template_and_generation_defaults():
    from pagedllm.default_model import default_model_path

    with serve_tiny_model(default_model_path(), None, num_kv_blocks=64) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "What is a tuple? "}]
        import httpx

        tokens = httpx.post(s.url + "/tokenize", json={"messages": msgs}).json()["tokens"]
        text = httpx.post(s.url + "/detokenize", json={"tokens": tokens}).json()["prompt"]
        # tokenizer_config.json's template: bos, "User: ...", "Assistant:"; one bos only.
        assert tokens[0] == 1 and tokens[1] != 1
        assert text == "User: What is a tuple?\n\nAssistant:"
        a, b = (client.chat.completions.create(model="default_model", messages=msgs, seed=s_,
                                               max_tokens=12).choices[0].message.content
                for s_ in (1, 2))
        greedy = [client.chat.completions.create(model="default_model", messages=msgs,
                                                 temperature=0, max_tokens=12)
                  .choices[0].message.content for _ in range(2)]
        # Unset temperature: generation_config.json's 0.8, so seeds differ; 0 is greedy.
        assert a != b and greedy[0] == greedy[1]
