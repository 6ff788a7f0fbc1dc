"""Workloads and statistics of ``pagedllm bench``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

from pagedllm.commands.common import UsageError, read_lines


@dataclass
class BenchRequest:
    """One request of a workload.

    Attributes:
        prompt: text, or {"prompt_token_ids": [...]}.
        max_tokens: tokens to generate.
        arrival: seconds after the start at which it is submitted.
        line: its line in the --file workload (None: synthetic).
    """

    prompt: Union[str, Dict]
    max_tokens: int
    arrival: float = 0.0
    line: Optional[int] = None


def _lengths(rng: np.random.Generator, num: int, median: int, spread: float) -> np.ndarray:
    # Log-normal around the median (spread = sigma of the log); 0 = every length equal.
    if spread <= 0:
        return np.full(num, median, dtype=np.int64)
    lens = np.exp(rng.normal(math.log(median), spread, size=num))
    return np.maximum(1, np.rint(lens)).astype(np.int64)


def synthetic(num_prompts: int, input_len: int, output_len: int, input_spread: float,
              output_spread: float, vocab_size: int, avoid_ids: Iterable[int],
              seed: int) -> List[BenchRequest]:
    """Random-token prompts of (log-normally spread) lengths; distinct prompts, so the prefix
    cache finds nothing beyond chance.

    Args:
        num_prompts: requests.
        input_len, output_len: median prompt and output lengths in tokens.
        input_spread, output_spread: sigma of the log-normal spread (0: fixed lengths).
        vocab_size: token ids are drawn from [0, vocab_size).
        avoid_ids: ids never drawn (bos / eos / other special tokens).
        seed: the workload's seed.
    """
    rng = np.random.default_rng(seed)
    avoid = np.asarray(sorted(set(avoid_ids)), dtype=np.int64)
    allowed = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), avoid)
    in_lens = _lengths(rng, num_prompts, input_len, input_spread)
    out_lens = _lengths(rng, num_prompts, output_len, output_spread)
    return [BenchRequest({"prompt_token_ids": rng.choice(allowed, size=int(n)).tolist()}, int(m))
            for n, m in zip(in_lens, out_lens)]


def from_file(path: str, default_max_tokens: int) -> List[BenchRequest]:
    """Requests from JSON Lines: {"prompt": text or [token ids], "max_tokens": N (optional)};
    the prompt may also be {"prompt_token_ids": [token ids]}, and token ids may be given as
    the line's own "prompt_token_ids" instead of a "prompt" (vLLM's form).

    Raises:
        UsageError: an unreadable file, or a line of another form (names the file and line).
    """
    try:
        with open(path, "rb") as f:
            lines = read_lines(f, f"workload file {path!r}")
    except OSError as e:
        raise UsageError(f"cannot read workload file {path!r}: {e.strerror} (check --file)") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise UsageError(f"{path}:{n}: expected a JSON object {{\"prompt\": text or token "
                             f"ids, \"max_tokens\": N (optional)}} (fix that line of --file)")
        if "prompt" in rec and "prompt_token_ids" in rec:
            raise UsageError(f"{path}:{n}: both \"prompt\" and \"prompt_token_ids\" are given: "
                             f"expected one of them (fix that line of --file)")
        if "prompt_token_ids" in rec:  # token ids only: never text
            ids = rec["prompt_token_ids"]
            prompt = _prompt(ids) if isinstance(ids, list) else None
        else:
            prompt = _prompt(rec.get("prompt"))
        if prompt is None:
            if "prompt_token_ids" in rec:
                want = '"prompt_token_ids" must be a non-empty list of token ids (integers >= 0)'
                got = _shown(rec["prompt_token_ids"])
            else:
                want = ('"prompt" must be non-empty text, a list of token ids (integers >= 0) or '
                        '{"prompt_token_ids": [...]}')
                got = _shown(rec["prompt"]) if "prompt" in rec else "none"
            raise UsageError(f"{path}:{n}: {want}, got {got} (fix that line of --file)")
        max_tokens = rec.get("max_tokens", default_max_tokens)
        if not (_is_int(max_tokens) and max_tokens >= 1):
            raise UsageError(f"{path}:{n}: \"max_tokens\" must be an integer >= 1, got "
                             f"{_shown(max_tokens)} (fix that line of --file)")
        out.append(BenchRequest(prompt, max_tokens, line=n))
    if not out:
        raise UsageError(f"{path}: no requests in the file (check --file)")
    return out


def _prompt(value) -> Union[str, Dict, None]:
    """A workload line's prompt as BenchRequest takes it (None: not a valid prompt)."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict) and set(value) == {"prompt_token_ids"}:
        value = value["prompt_token_ids"]
    if isinstance(value, list) and value and all(_is_int(t) and t >= 0 for t in value):
        return {"prompt_token_ids": value}
    return None


def _shown(value) -> str:
    """A JSON value as the file spells it, cut short."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value) -> bool:
    """An integer, not a bool (JSON's true is not 1 here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def assign_arrivals(requests: List[BenchRequest], rate: float, seed: int) -> None:
    """Poisson arrivals at `rate` requests/s (inf: all at time 0)."""
    if math.isinf(rate):
        return
    gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate, size=len(requests))
    for r, t in zip(requests, np.cumsum(gaps) - gaps[0]):
        r.arrival = float(t)


def percentiles(values: Sequence[float], scale: float = 1.0) -> Dict[str, float]:
    """mean, p50, p90, p99 of `values` times `scale` (empty: zeros)."""
    if not len(values):
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    a = np.asarray(values, dtype=np.float64) * scale
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}
