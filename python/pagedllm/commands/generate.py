"""Generate text for prompts, streaming it to the terminal.

Prompts come from the arguments and/or --file (one prompt per line, or JSON Lines with a
"prompt" field; "-" reads stdin). All prompts run together in one continuously batched engine;
the output is printed in prompt order, the current one streamed token by token. Sampling flags
left unset take the checkpoint's generation_config.json values (as vLLM does). Throughput and
KV-cache figures go to stderr at the end.

examples:
  pagedllm generate "The list type"
  pagedllm generate --model ./llama --max-tokens 64 --temperature 0.8 "Once upon a time"
  pagedllm generate --file prompts.txt --stop "\\n\\n"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional, TextIO

from pagedllm.engine.llm_engine import without_request_id
from pagedllm.commands.common import (UsageError, add_engine_args, add_trace_arg, build_engine,
                                      engine_config, positive_int, report_trace,
                                      start_trace)
from pagedllm.commands.report import kv_summary
from pagedllm.commands.stats_file import add_stats_file_arg, open_stats_file
from pagedllm.streaming import ChoiceTracker, holdback_for

NAME = "generate"
HELP = "generate text for prompts (streamed to the terminal)"
DEFAULT_MAX_TOKENS = 64
_SAMPLING_FLAGS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text")
    p.add_argument("--file", metavar="FILE",
                   help="more prompts: one per line, or .jsonl with a 'prompt' field ('-': stdin)")
    s = p.add_argument_group("sampling (unset: the checkpoint's generation_config.json, "
                             "else the default shown)")
    s.add_argument("--max-tokens", type=positive_int, metavar="N",
                   help="tokens to generate per prompt (64)")
    s.add_argument("--temperature", type=float, metavar="T",
                   help="0 = greedy; higher = more random (1.0)")
    s.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling (1.0)")
    s.add_argument("--top-k", type=int, metavar="K", help="top-k sampling (-1: off)")
    s.add_argument("--min-p", type=float, metavar="P", help="min-p sampling (0: off)")
    s.add_argument("--repetition-penalty", type=float, metavar="R",
                   help="penalize repeated tokens (1.0: off)")
    s.add_argument("-n", "--n", type=positive_int, default=1, dest="n",
                   help="completions per prompt (1)")
    s.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop at this text (repeatable; escapes like \\n are understood)")
    s.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    o = p.add_argument_group("output")
    o.add_argument("--no-echo", action="store_true", help="print only the generated text")
    o.add_argument("--quiet", action="store_true", help="no throughput / KV figures at the end")
    add_stats_file_arg(o)
    add_trace_arg(o)
    add_engine_args(p)


def read_prompts(args: argparse.Namespace) -> List[str]:
    """The prompts of the arguments then of --file, in order."""
    prompts = list(args.prompts)
    if args.file:
        prompts += _read_file(args.file)
    if not prompts:
        raise UsageError("no prompt given (pass PROMPT arguments or --file FILE)")
    return prompts


def _read_file(path: str) -> List[str]:
    try:
        f: TextIO = sys.stdin if path == "-" else open(path, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read prompt file {path!r}: {e.strerror} (check --file)") from None
    with f:
        lines = [line.rstrip("\n") for line in f]
    if not path.endswith(".jsonl"):
        return [line for line in lines if line.strip()]
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompts.append(record["prompt"] if isinstance(record, dict) else None)
        except (ValueError, KeyError):
            prompts.append(None)
        if not isinstance(prompts[-1], str):
            raise UsageError(f"{path}:{n}: expected a JSON object with a string 'prompt'")
    return prompts


def _unescape(text: str) -> str:
    return text.encode("utf-8").decode("unicode_escape") if "\\" in text else text


class OrderedPrinter:
    """Prints completions in (prompt, choice) order, streaming the one at the head.

    Args:
        prompts: the prompt texts.
        n: completions per prompt.
        holdback: characters held back for stop strings (see pagedllm.streaming).
        echo: print each prompt before its completion.
        out: where to write.
    """

    def __init__(self, prompts: List[str], n: int, holdback: int, echo: bool, out: TextIO):
        self.prompts, self.n, self.echo, self.out = prompts, n, echo, out
        self.units = [(i, j) for i in range(len(prompts)) for j in range(n)]
        self.trackers = {u: ChoiceTracker(holdback) for u in self.units}
        self.pending = {u: "" for u in self.units}   # text received but not printed yet
        self.head = 0
        self._header()

    def update(self, prompt_index: int, output) -> None:
        """Takes a request's cumulative RequestOutput and prints what can be printed."""
        for comp in output.outputs:
            unit = (prompt_index, comp.index)
            delta = self.trackers[unit].advance(comp)
            if delta is not None:
                self.pending[unit] += delta.text
        self._flush()

    def _header(self) -> None:
        if self.head >= len(self.units):
            return
        i, j = self.units[self.head]
        if len(self.units) > 1:
            label = f"prompt {i + 1}" + (f", completion {j + 1}" if self.n > 1 else "")
            gap = "\n" if self.head > 0 else ""
            self.out.write(f"{gap}--- {label} ---\n")
        if self.echo:
            self.out.write(self.prompts[i])
        self.out.flush()

    def _flush(self) -> None:
        while self.head < len(self.units):
            unit = self.units[self.head]
            if self.pending[unit]:
                self.out.write(self.pending[unit])
                self.pending[unit] = ""
            if not self.trackers[unit].done:
                break
            self.out.write("\n")
            self.head += 1
            self._header()
        self.out.flush()


def run(args: argparse.Namespace) -> int:
    prompts = read_prompts(args)
    config = engine_config(args)
    from pagedllm.sampling_params import SamplingParams

    stops = [_unescape(s) for s in args.stop]
    given = {k: getattr(args, k) for k in _SAMPLING_FLAGS if getattr(args, k) is not None}
    given.update(n=args.n, stop=stops, ignore_eos=args.ignore_eos)
    _sampling_params(SamplingParams, given)  # bad flags fail before the model loads
    engine = build_engine(config)
    start_trace(engine, args)
    stats = open_stats_file(engine, args)
    defaults = {"max_tokens": DEFAULT_MAX_TOKENS, **engine.generation_defaults()}
    params = _sampling_params(SamplingParams, {**defaults, **given})
    usage: List[float] = []
    engine.on_step = lambda s: usage.append(s["used_blocks"] / max(1, s["num_blocks"]))
    start = time.perf_counter()
    index = {}
    for i, prompt in enumerate(prompts):
        try:
            index[engine.add_request(f"generate-{i}", prompt, params)] = i
        except ValueError as e:
            raise UsageError(f"prompt {i + 1}: {without_request_id(str(e))} (lower --max-tokens, or "
                             "raise --max-model-len / --kv-cache-memory)") from None
    printer = OrderedPrinter(prompts, args.n, holdback_for(stops), not args.no_echo, sys.stdout)
    first_token: Optional[float] = None
    while engine.has_unfinished_requests():
        outs = engine.step()
        for out in outs:
            if first_token is None and any(c.token_ids for c in out.outputs):
                first_token = time.perf_counter()
            printer.update(index[out.request_id], out)
        if stats is not None:
            stats.after_step(outs)
    elapsed = time.perf_counter() - start
    if stats is not None:
        stats.write()
    report_trace(engine.stop_trace())
    if not args.quiet:
        _report(engine, len(prompts), elapsed, first_token - start if first_token else None, usage)
    return 0


def _sampling_params(cls, fields: dict):
    try:
        return cls(**fields)
    except ValueError as e:
        raise UsageError(str(e).replace("SamplingParams.", "--").replace("_", "-")) from None


def _report(engine, num_prompts: int, elapsed: float, ttft: Optional[float], usage) -> None:
    gen = engine.num_generation_tokens
    ttft_text = f", first token after {ttft * 1000:.0f} ms" if ttft is not None else ""
    print(f"\n{gen} tokens generated for {num_prompts} prompt{'s' * (num_prompts != 1)} "
          f"({engine.num_prompt_tokens} prompt tokens) in {elapsed:.2f} s: "
          f"{gen / elapsed if elapsed > 0 else 0:.1f} tokens/s{ttft_text}", file=sys.stderr)
    print(kv_summary(engine.kv_cache_stats(), usage), file=sys.stderr)
