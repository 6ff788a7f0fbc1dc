"""Helpers of the server, async-engine and CLI tests.

- ``ScriptedEngine``: a stand-in for LLMEngine with the same request API (add_request / step /
  abort_request / has_unfinished_requests / kv_cache_stats) and a byte-level tokenizer, whose
  "model" writes a fixed text. It keeps block accounting like the real pool, so tests can check
  that aborts free blocks, and it is fast and exact, so the HTTP layer (auth, validation, SSE
  framing, stop-string hold-back, disconnects) is tested apart from the model.
- ``ServerThread``: uvicorn serving an app on a free loopback port, in a background thread.
- ``write_tiny_model``: a random-weight tiny Llama checkpoint plus a trained BPE tokenizer, for
  the end-to-end tests on the real engine.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Dict, List, Optional

import pytest

from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput
from pagedllm.sampling_params import SamplingParams

SCRIPT = "the quick brown fox jumps over the lazy dog. "


class ByteTokenizer:
    """Token = UTF-8 byte + 3; 1 is bos (prepended), 2 is eos."""

    bos_token_id = 1
    eos_token_ids = (2,)
    vocab_size = 259

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        ids = [b + 3 for b in text.encode("utf-8")]
        return [1] + ids if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", "replace")


class _Req:
    def __init__(self, rid, prompt_ids, params: SamplingParams, arrival):
        self.rid, self.prompt_ids, self.params, self.arrival = rid, prompt_ids, params, arrival
        start = sum(prompt_ids) % len(SCRIPT)
        spread = params.temperature > 0
        self.starts = [(start + (7 * i if spread else 0) + (params.seed or 0)) % len(SCRIPT)
                       for i in range(params.n)]
        self.tokens: List[List[int]] = [[] for _ in range(params.n)]
        self.texts = [""] * params.n
        self.finish: List[Optional[str]] = [None] * params.n
        self.stop_reason: List[object] = [None] * params.n
        self.logprobs = [[] for _ in range(params.n)] if params.logprobs is not None else None
        self.first_token_time = None


class ScriptedEngine:
    """LLMEngine's request API over a scripted model (one byte of SCRIPT per step and choice).

    Args:
        block_size, num_blocks: the simulated pool (used_blocks counts the live requests'
            blocks, ceil(tokens / block_size) per choice).
        step_delay: seconds each step sleeps (stands in for the forward pass).
        max_model_len: the longest prompt + max_tokens accepted.
    """

    def __init__(self, block_size: int = 4, num_blocks: int = 4096, step_delay: float = 0.002,
                 max_model_len: int = 512, model_path: str = "/models/scripted"):
        self.tokenizer = ByteTokenizer()
        self.model_path = model_path
        self.max_model_len = max_model_len
        self.block_size, self.num_blocks, self.step_delay = block_size, num_blocks, step_delay
        self.requests: Dict[str, _Req] = {}
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.num_steps = 0
        self.thread_ids = set()  # threads that called into the engine
        self.fail_next_step = False
        self.extra_keys: Dict[str, int] = {}  # request id -> the prefix-cache namespace it got

    def add_request(self, request_id, prompt, params=None, arrival_time=None, extra_key=0,
                    group=None):
        self.thread_ids.add(threading.get_ident())
        params = params or SamplingParams()
        ids = list(prompt["prompt_token_ids"]) if isinstance(prompt, dict) else self.tokenizer.encode(prompt)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not ids:
            raise ValueError(f"request {request_id}: the prompt is empty")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"request {request_id}: prompt ({len(ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) = {len(ids) + params.max_tokens} exceeds "
                             f"max_model_len ({self.max_model_len})")
        if any(not 0 <= t < self.tokenizer.vocab_size for t in ids):
            raise ValueError(f"request {request_id}: prompt token id out of the vocabulary")
        self.requests[request_id] = _Req(request_id, ids, params,
                                         arrival_time if arrival_time is not None else time.monotonic())
        self.extra_keys[request_id] = extra_key
        self.num_prompt_tokens += len(ids)
        return request_id

    def abort_request(self, request_id):
        self.thread_ids.add(threading.get_ident())
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            self.requests.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> List[RequestOutput]:
        self.thread_ids.add(threading.get_ident())
        if self.fail_next_step:
            raise RuntimeError("scripted failure")
        time.sleep(self.step_delay)
        self.num_steps += 1
        now = time.monotonic()
        outputs = []
        for rid, r in list(self.requests.items()):
            r.first_token_time = r.first_token_time or now
            for i in range(r.params.n):
                if r.finish[i] is None:
                    self._advance(r, i)
            done = all(f is not None for f in r.finish)
            outputs.append(RequestOutput(
                rid, None, r.prompt_ids, self._prompt_logprobs(r),
                [CompletionOutput(i, r.texts[i], list(r.tokens[i]), None,
                                  list(r.logprobs[i]) if r.logprobs else None, r.finish[i],
                                  r.stop_reason[i]) for i in range(r.params.n)],
                done, {"arrival_time": r.arrival, "first_token_time": r.first_token_time,
                       **({"finish_time": now} if done else {})}))
            if done:
                del self.requests[rid]
        return outputs

    @staticmethod
    def _prompt_logprobs(r: _Req):
        """None, then per prompt token: itself at -1.0 (rank 1) and k alternatives below."""
        k = r.params.prompt_logprobs
        if k is None:
            return None
        out = [None]
        for t in r.prompt_ids[1:]:
            pos = {t: Logprob(-1.0, 1, chr(t - 3) if t >= 3 else "")}
            for j in range(k):
                alt = ord("A") + 3 + j
                pos.setdefault(alt, Logprob(-3.0 - j, j + 2, chr(alt - 3)))
            out.append(pos)
        return out

    def _advance(self, r: _Req, i: int) -> None:
        char = SCRIPT[(r.starts[i] + len(r.tokens[i])) % len(SCRIPT)]
        token = ord(char) + 3
        r.tokens[i].append(token)
        self.num_generation_tokens += 1
        if r.logprobs is not None:
            pos = {token: Logprob(-0.25, 1, char)}
            for k in range(r.params.logprobs):
                alt = ord("a") + 3 + k if ord("a") + 3 + k != token else ord("z") + 3
                pos.setdefault(alt, Logprob(-2.0 - k, k + 2, chr(alt - 3)))
            r.logprobs[i].append(pos)
        r.texts[i] += char
        p = r.params
        for stop in p.stop:
            at = r.texts[i].find(stop, max(0, len(r.texts[i]) - len(stop)))
            if at != -1:
                r.texts[i] = r.texts[i][: at + len(stop)] if p.include_stop_str_in_output else r.texts[i][:at]
                r.finish[i], r.stop_reason[i] = "stop", stop
                return
        if len(r.tokens[i]) >= p.max_tokens:
            r.finish[i] = "length"

    def kv_cache_stats(self) -> dict:
        used = sum(-(-(len(r.prompt_ids) + len(t)) // self.block_size)
                   for r in self.requests.values() for t in r.tokens)
        return {"num_blocks": self.num_blocks, "block_size": self.block_size, "used_blocks": used,
                "prefix_cache_queries": self.num_prompt_tokens, "prefix_cache_hits": 0,
                "num_preemptions": 0, "num_requests_running": len(self.requests),
                "num_requests_waiting": 0, "utilization": 1.0}


def scripted_completion(prompt_ids: List[int], n_chars: int) -> str:
    """The text ScriptedEngine writes greedily for a prompt."""
    start = sum(prompt_ids) % len(SCRIPT)
    return "".join(SCRIPT[(start + k) % len(SCRIPT)] for k in range(n_chars))


class ServerThread:
    """Serves an ASGI app with uvicorn on 127.0.0.1:<free port> in a background thread.

    Use as a context manager; ``url`` is the base URL (no trailing slash).
    """

    def __init__(self, app):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        daemon=True)

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(30)
        self._sock.close()


# --- a real (tiny, random-weight) model for end-to-end tests ------------------------------------
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "paged attention keeps the key value cache in fixed size blocks",
    "a block table maps each sequence to its physical blocks",
    "hello world, hello there! the weather is nice today.",
    "once upon a time there was a tiny language model that wrote stories",
] * 40


def write_tiny_model(path, seed: int = 0, max_position_embeddings: int = 1024) -> str:
    """A random-weight 'tiny' Llama checkpoint with a trained byte-level BPE tokenizer.

    Special tokens: <unk> 0, <s> 1 (bos, added by the tokenizer), </s> 2 (eos). The model's
    vocabulary is exactly the tokenizer's, so every generated id decodes to text. Weights are
    drawn with std 0.1 (transformers' 0.02 makes a random model repeat one token).
    Returns the directory as a string.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from pagedllm.model import write_random_checkpoint

    os.makedirs(path, exist_ok=True)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(CORPUS, trainer)
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tk.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        f.write('{"bos_token": "<s>", "eos_token": "</s>"}')
    write_random_checkpoint(path, "tiny", seed=seed, vocab_size=tk.get_vocab_size(),
                            bos_token_id=1, eos_token_id=2,
                            max_position_embeddings=max_position_embeddings,
                            initializer_range=0.1)  # varied text, clear greedy margins
    return str(path)


def serve_tiny_model(model_dir: str, settings=None, **engine_options) -> ServerThread:
    """A ServerThread (not yet entered) serving an LLMEngine on `model_dir` (one CPU thread)."""
    from pagedllm.config import EngineConfig
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.server import create_app

    engine_options.setdefault("num_threads", 1)
    engine = LLMEngine(EngineConfig(model=model_dir, **engine_options))
    return ServerThread(create_app(engine, settings))


def scrape(url: str) -> Dict[str, float]:
    """/metrics of a server as {sample name: value}, label sets summed, plus
    {'name{label="value"}': value} for samples with labels other than model_name / le."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: Dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())
                              if k not in ("model_name", "le"))
            if labels:
                key = f"{s.name}{{{labels}}}"
                out[key] = out.get(key, 0.0) + s.value
    return out


@pytest.fixture(scope="module")
def client(server):
    """An httpx client on the test module's own `server` fixture (import it with that one)."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def wait_idle(url: str, within_s: float) -> Dict[str, float]:
    """Waits until the server at `url` runs and queues nothing and holds no KV block.

    Returns:
        Its /metrics (scrape()) once idle.
    Raises:
        AssertionError: still busy after within_s (with the last metrics).
    """
    deadline = time.monotonic() + within_s
    while True:
        m = scrape(url)
        if (m["pagedllm:num_requests_running"], m["pagedllm:num_requests_waiting"],
                m["pagedllm:kv_cache_used_blocks"]) == (0, 0, 0):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle after {within_s} s: {m}")
        time.sleep(0.05)


async def stream_completion(client, body: dict, leave_after: Optional[int]):
    """Streams one /v1/completions request with an httpx.AsyncClient, checking the SSE framing.

    Args:
        client: the async client on the server.
        body: the request body (with "stream": true and usage in the stream options).
        leave_after: close the connection after this many events (None: read to the end).
    Returns:
        (text, finish_reason, completion_tokens), or None when it left mid-stream.
    """
    text, finish, usage = "", None, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        chunks = 0
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            event = json.loads(data)
            for c in event["choices"]:
                text += c["text"]
                finish = c["finish_reason"] or finish
            usage = event.get("usage") or usage
            chunks += 1
            if leave_after is not None and chunks >= leave_after:
                return None  # closing the response drops the connection mid-stream
    return text, finish, usage["completion_tokens"]
