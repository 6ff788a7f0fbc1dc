"""Load: 64 concurrent streaming clients on the real engine, every fourth one leaving midway.

Every request that completes must be whole and correct: its streamed text and token count
equal the same request run alone (greedy). The pool is small enough that requests are
preempted and recomputed along the way. Afterwards the server holds nothing: no running or
waiting request, no used block.
"""

import asyncio

import httpx
import pytest

from server_fixtures import serve_tiny_model, stream_completion, wait_idle, write_tiny_model

NUM_CLIENTS = 64
WORDS = ["the", "quick", "brown", "fox", "paged", "attention", "block", "table", "hello",
         "world", "tiny", "model", "cache", "value", "key", "story"]


def leaves(i):
    """Whether client i disconnects midway."""
    return i % 4 == 3


def request_body(i):
    # Distinct prompts of 3-10 words, some sharing a first word (prefix-cache traffic). The
    # clients that leave ask for many tokens past any EOS, so they still run when they go.
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 8)]
    max_tokens = 64 if leaves(i) else 6 + (i * 5) % 11
    return {"prompt": " ".join(words), "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": leaves(i), "stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("tiny"))
    # 48 blocks of 16 tokens for 64 requests of 10 to 90 tokens: preemption.
    with serve_tiny_model(model, None, num_kv_blocks=48, block_size=16, max_model_len=256) as s:
        yield s


def test_64_concurrent_streams_with_disconnects(server):
    async def load():
        limits = httpx.Limits(max_connections=NUM_CLIENTS + 8)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            leave = [2 if leaves(i) else None for i in range(NUM_CLIENTS)]
            return await asyncio.gather(*(stream_completion(client, request_body(i), leave[i])
                                          for i in range(NUM_CLIENTS)))

    results = asyncio.run(load())
    completed = {i: r for i, r in enumerate(results) if r is not None}
    assert len(completed) == NUM_CLIENTS - NUM_CLIENTS // 4

    # Each completed request equals the same request run alone.
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for i, (text, finish, n_tokens) in completed.items():
            alone = client.post("/v1/completions",
                                json={**request_body(i), "stream": False}).json()
            choice = alone["choices"][0]
            assert (text, finish, n_tokens) == (choice["text"], choice["finish_reason"],
                                                alone["usage"]["completion_tokens"]), i

    # Nothing is left: aborted requests freed their blocks.
    m = wait_idle(server.url, 20)
    assert m["pagedllm:kv_cache_usage_perc"] == 0
    assert m['pagedllm:request_success_total{finished_reason="abort"}'] == NUM_CLIENTS // 4
    assert m["pagedllm:num_preemptions_total"] > 0  # the small pool did preempt
