"""The OpenAI server on a tensor-parallel engine: the same completions as the in-process engine
and transformers; a rank killed mid-stream ends the stream with an error naming it, and every
later request gets a 503 saying so (no hang, no orphan)."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from engine_fixtures import hf_greedy
from pagedllm import LLM, SamplingParams
from server_fixtures import serve_tiny_model, write_tiny_model
from tp_fixtures import wait_gone

pytestmark = pytest.mark.slow
PROMPTS = ["the quick brown fox", "a block table maps", "hello world"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tp_server_model"), seed=4)


def test_tp2_server_completions_equal_tp1_and_transformers_then_a_dead_rank_is_named(tiny_dir):
    one = LLM(tiny_dir, num_kv_blocks=64, num_threads=1)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    expected = one.generate(PROMPTS, params)
    for out in expected:
        assert out.outputs[0].token_ids == hf_greedy(tiny_dir, out.prompt_token_ids, 10)

    server = serve_tiny_model(tiny_dir, num_kv_blocks=64, tensor_parallel_size=2,
                              distributed_timeout_s=120)
    engine = server.server.config.app.state.server.engine.engine
    pids = list(engine.executor.worker_pids)
    with server, httpx.Client(base_url=server.url, timeout=100) as client:
        for prompt, want in zip(PROMPTS, expected):
            r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 10,
                                                     "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want.outputs[0].text

        # A rank killed mid-stream: the stream ends with an error event naming it.
        body = {"prompt": "hello", "max_tokens": 500, "ignore_eos": True, "stream": True}
        payloads = []
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    payloads.append(line[len("data: "):])
                    if len(payloads) == 3:
                        os.kill(pids[1], signal.SIGKILL)
        assert payloads[-1] == "[DONE]"
        error = json.loads(payloads[-2])["error"]
        assert f"rank 1 (pid {pids[1]}) died (killed by signal 9)" in error["message"], error
        assert len(payloads) < 500  # it did not run to the end
        # Then every request is refused with a 503 that says why.
        r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        assert r.status_code == 503, r.text
        assert f"rank 1 (pid {pids[1]}) died" in r.json()["error"]["message"]
    engine.shutdown()
    assert wait_gone(pids) == []
