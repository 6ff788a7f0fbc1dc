"""Seeded request workloads shared by every engine in a comparison.

A workload is a list of requests, each a prompt of token ids and a forced output length
(outputs are forced with ignore_eos / min_tokens so every engine does the same work).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List


@dataclass
class BenchRequest:
    """One request: its prompt token ids and how many tokens to generate."""

    prompt_token_ids: List[int]
    max_tokens: int


def lognormal_lengths(n: int, mean: float, sigma: float, lo: int, hi: int, rng: random.Random) -> List[int]:
    """n integers from a log-normal with the given arithmetic mean and log-space sigma, clipped.

    Args:
        n: how many.
        mean: the arithmetic mean wanted (before clipping).
        sigma: standard deviation of log(length).
        lo, hi: clip bounds.
        rng: the random source.
    Returns:
        The lengths.
    """
    mu = math.log(mean) - sigma * sigma / 2  # E[X] = exp(mu + sigma^2 / 2)
    return [max(lo, min(hi, int(round(rng.lognormvariate(mu, sigma))))) for _ in range(n)]


# The mixed workload's length distributions (docs/BENCHMARKS.md), full size and smoke size; a
# section takes one and sets only its number of requests: dict(MIXED, n=200).
MIXED = dict(prompt_mean=128, prompt_sigma=0.8, output_mean=64, output_sigma=0.8,
             max_prompt=1024, max_output=512)
QUICK_MIXED = dict(prompt_mean=48, prompt_sigma=0.8, output_mean=16, output_sigma=0.8,
                   max_prompt=256, max_output=64)


def mixed_workload(n: int, vocab: int, seed: int = 0, prompt_mean: float = 256,
                   prompt_sigma: float = 0.8, output_mean: float = 128, output_sigma: float = 0.8,
                   max_prompt: int = 1536, max_output: int = 512) -> List[BenchRequest]:
    """The offline mixed workload: log-normal prompt and output lengths, random token ids."""
    rng = random.Random(seed)
    plens = lognormal_lengths(n, prompt_mean, prompt_sigma, 4, max_prompt, rng)
    olens = lognormal_lengths(n, output_mean, output_sigma, 4, max_output, rng)
    return [BenchRequest([rng.randrange(3, vocab) for _ in range(p)], o) for p, o in zip(plens, olens)]


def uniform_workload(n: int, vocab: int, prompt_len: int, output_len: int, seed: int = 0) -> List[BenchRequest]:
    """n requests of the same prompt and output lengths."""
    rng = random.Random(seed)
    return [BenchRequest([rng.randrange(3, vocab) for _ in range(prompt_len)], output_len) for _ in range(n)]


def long_prompt_workload(n: int, vocab: int, min_prompt: int, max_prompt: int, output_len: int,
                         seed: int = 0) -> List[BenchRequest]:
    """n requests with prompt lengths uniform in [min_prompt, max_prompt] and a fixed output.

    The prefill-heavy workload (1k-4k-token prompts in the full run): it weighs prompt
    attention and the prefill GEMMs where the mixed workload weighs decode steps.

    Args:
        n: requests.
        vocab: token ids are drawn from [3, vocab).
        min_prompt, max_prompt: prompt length bounds (inclusive).
        output_len: tokens generated per request.
        seed: the random source's seed.
    Returns:
        The requests.
    """
    rng = random.Random(seed)
    plens = [rng.randint(min_prompt, max_prompt) for _ in range(n)]
    return [BenchRequest([rng.randrange(3, vocab) for _ in range(p)], output_len) for p in plens]


def shared_prefix_workload(n: int, vocab: int, prefix_len: int, suffix_mean: float,
                           output_len: int, seed: int = 0, sigma: float = 0.5) -> List[BenchRequest]:
    """n requests that all start with the same `prefix_len`-token system prompt.

    Each then has its own log-normal user part (mean `suffix_mean`, at least 1 token) and a
    forced output of `output_len` tokens.
    """
    rng = random.Random(seed)
    system = [rng.randrange(3, vocab) for _ in range(prefix_len)]
    suffixes = lognormal_lengths(n, suffix_mean, sigma, 1, 8 * int(suffix_mean), rng)
    return [BenchRequest(system + [rng.randrange(3, vocab) for _ in range(s)], output_len)
            for s in suffixes]


def describe(reqs: List[BenchRequest]) -> dict:
    """Means, spreads and totals of a workload, for the tables."""
    def stats(xs):
        m = sum(xs) / len(xs)
        sd = (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5
        s = sorted(xs)
        return {"mean": round(m, 1), "std": round(sd, 1), "min": s[0], "p50": s[len(s) // 2], "max": s[-1]}

    return {"num_requests": len(reqs),
            "prompt_len": stats([len(r.prompt_token_ids) for r in reqs]),
            "output_len": stats([r.max_tokens for r in reqs]),
            "total_output_tokens": sum(r.max_tokens for r in reqs)}


def save(reqs: List[BenchRequest], path: Path) -> None:
    """Writes a workload as JSON (for engines running in another process)."""
    path.write_text(json.dumps([asdict(r) for r in reqs]))


def load(path: Path) -> List[BenchRequest]:
    """Reads a workload written by save()."""
    return [BenchRequest(**d) for d in json.loads(Path(path).read_text())]
