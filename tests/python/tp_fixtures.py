"""Helpers of the tensor-parallel tests: tiny random checkpoints of each head layout, and the
checks that worker processes are gone."""

from __future__ import annotations

import os
import threading
import time
from typing import Iterable, List

# Each split the shards must get right at tensor_parallel_size 2 (4 query heads, hidden 64).
TP_MODELS = {
    "mha": dict(num_key_value_heads=4),                      # KV heads split 2 + 2
    "gqa": dict(num_key_value_heads=2),                      # KV heads == ranks
    "mqa": dict(num_key_value_heads=1),                      # KV heads < ranks: replicated
    # tied lm_head, an odd vocabulary (the last rank's shard is padded), biases on every
    # projection (row-parallel biases are added once, after the all-reduce)
    "tied_bias": dict(num_key_value_heads=2, tie_word_embeddings=True, vocab_size=501,
                      attention_bias=True, mlp_bias=True),
}
_BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             vocab_size=512, max_position_embeddings=512)


def write_tp_model(path, kind: str, seed: int = 3, **overrides) -> str:
    """A random-weight checkpoint of layout `kind` (TP_MODELS) in `path`, with `overrides` of
    the config (hidden_size=256: head_dim 64, as the CUDA kernels need); returns it."""
    from pagedllm.model import write_random_checkpoint

    write_random_checkpoint(path, preset={**_BASE, **TP_MODELS[kind], **overrides}, seed=seed,
                            initializer_range=0.1)
    return str(path)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids: Iterable[int], within_s: float = 30.0) -> List[int]:
    """Waits up to within_s for every pid to exit; returns those still alive."""
    pids = list(pids)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def worker_pids(llm) -> List[int]:
    """The tensor-parallel ranks' process ids of an LLM."""
    return list(llm.engine.executor.worker_pids)


def wait_steps(llm, n: int, within_s: float = 60.0) -> None:
    """Waits until the engine has run n steps (another thread drives it)."""
    deadline = time.monotonic() + within_s
    while llm.engine.num_steps < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine ran only {llm.engine.num_steps} steps")
        time.sleep(0.01)



def signal_rank_mid_request(llm, sig: int, prompts, max_tokens: int = 400) -> BaseException:
    """Starts llm.generate(prompts) in a thread, sends `sig` to rank 1 after 3 steps, and
    returns what generate raised (asserting it raised, within 100 s).

    Args:
        llm: an LLM with tensor_parallel_size 2.
        sig: the signal (SIGKILL: a dead rank; SIGSTOP: a hung one).
        prompts: token-id prompts, long enough in max_tokens to outlast the signal.
        max_tokens: greedy tokens per prompt.
    Returns:
        The exception generate raised.
    """
    from engine_fixtures import greedy, tok

    box = {}

    def run():
        try:
            llm.generate(tok(prompts), greedy(max_tokens))
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_steps(llm, 3)
    os.kill(worker_pids(llm)[1], sig)
    thread.join(100)
    assert not thread.is_alive(), "generate did not return after the rank was signalled"
    assert "error" in box, "generate finished although rank 1 was signalled"
    return box["error"]
