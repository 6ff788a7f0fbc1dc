"""Soak (issue 20): 256 concurrent streaming clients on a small pool of the real engine, a
seeded random fifth of them leaving midway, with hostile requests mixed in (out-of-range
numbers, NaN, lone surrogates, oversized n, scoring requests, salted prompts).

Afterwards: every hostile request got a 4xx (never a 500), every well-formed request that
stayed got the same answer as when run alone, the server is healthy and holds no block.
"""

import asyncio
import random

import httpx
import pytest

from pagedllm.server import ServerSettings
from server_fixtures import (serve_tiny_model, stream_completion, wait_idle,
                             write_tiny_model)

pytestmark = pytest.mark.slow

NUM_CLIENTS = 256
WORDS = ["the", "quick", "brown", "fox", "paged", "attention", "block", "table", "hello",
         "world", "tiny", "model", "cache", "value", "key", "story"]
HOSTILE = [
    '{"prompt": "x", "top_k": 9223372036854775808}',
    '{"prompt": "x", "temperature": NaN}',
    '{"prompt": "a\\ud800", "stream": true}',
    '{"messages": [{"role": "user", "content": "\\udfff"}], "stream": true}',
    '{"prompt": "x", "n": 100000, "stream": true}',
    '{"prompt": ["x", "y", "z"], "n": 128, "best_of": 128}',
    '{"prompt": "x", "seed": 18446744073709551616}',
    '{"prompt": "x", "logprobs": 1000}',
    '{"prompt": [0, 99999999999]}',
]


def body(i, rng):
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(2 + i % 9)]
    b = {"prompt": " ".join(words), "max_tokens": 3 + i % 6, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True, "continuous_usage_stats": i % 2 == 0}}
    if i % 5 == 0:
        b["cache_salt"] = f"tenant-{i % 3}"
    if i % 7 == 0:
        b.update(echo=True, logprobs=1, max_tokens=0 if i % 14 == 0 else 1)
    return b


async def hostile(client, raw):
    path = "/v1/chat/completions" if '"messages"' in raw else "/v1/completions"
    r = await client.post(path, content=raw.encode("ascii"),
                          headers={"Content-Type": "application/json"})
    return r.status_code


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("tiny"))
    settings = ServerSettings(max_sequences_per_request=64)
    with serve_tiny_model(model, settings, num_kv_blocks=40, block_size=16,
                          max_model_len=256) as s:
        yield s


def test_256_streams_with_disconnects_and_hostile_requests(server):
    rng = random.Random(20)
    bodies = [body(i, rng) for i in range(NUM_CLIENTS)]
    leave = [rng.randint(1, 3) if rng.random() < 0.2 else None for _ in range(NUM_CLIENTS)]

    async def load():
        limits = httpx.Limits(max_connections=NUM_CLIENTS + 32)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as client:
            work = [stream_completion(client, bodies[i], leave[i]) for i in range(NUM_CLIENTS)]
            work += [hostile(client, raw) for raw in HOSTILE * 3]
            return await asyncio.gather(*work)

    results = asyncio.run(load())
    streamed, statuses = results[:NUM_CLIENTS], results[NUM_CLIENTS:]
    assert all(400 <= s < 500 for s in statuses), statuses

    with httpx.Client(base_url=server.url, timeout=120) as client:
        assert client.get("/health").status_code == 200
        for i, got in enumerate(streamed):
            if got is None:
                continue
            alone = client.post("/v1/completions", json={**bodies[i], "stream": False}).json()
            choice = alone["choices"][0]
            assert got == (choice["text"], choice["finish_reason"],
                           alone["usage"]["completion_tokens"]), i

    wait_idle(server.url, 30)  # and nothing is left: the leavers freed their blocks
    # Only the clients told to leave left (one with a stream shorter than its leaving point
    # finishes), and some did.
    left = [i for i, r in enumerate(streamed) if r is None]
    assert left and all(leave[i] is not None for i in left)
