"""Generate text for prompts, streaming it to the terminal.

Prompts come from the arguments and/or --file (one prompt per line, or JSON Lines with a
"prompt" field; "-" reads stdin). All prompts run together in one continuously batched engine;
the output is printed in prompt order, the current one streamed token by token. Sampling flags
left unset take the checkpoint's generation_config.json values (as vLLM does). Throughput and
KV-cache figures go to stderr at the end. A request the engine fails (e.g. --check-numerics
fail) keeps what it printed; stderr then names each failed prompt and why, and the exit code
is 1.

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
from typing import Dict, List, Optional, TextIO, Tuple

from pagedllm.commands import HELPS
from pagedllm.commands.common import (UsageError, add_engine_args, add_trace_arg, build_engine,
                                      end_run, engine_config, is_length_error, length_fix,
                                      make_sampling_params, positive_int, read_lines,
                                      report_failures, request_failure, start_trace)
from pagedllm.commands.report import kv_summary
from pagedllm.commands.stats_file import add_stats_file_arg, check_stats_file, open_stats_file
from pagedllm.streaming import ChoiceTracker, holdback_for

NAME = "generate"
HELP = HELPS[NAME]
DEFAULT_MAX_TOKENS = 64
_SAMPLING_FLAGS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text")
    p.add_argument("--file", metavar="FILE",
                   help="more prompts: one per line, or .jsonl with a 'prompt' field ('-': stdin)")
    s = p.add_argument_group("sampling (unset: the checkpoint's generation_config.json, "
                             "else the default shown)")
    s.add_argument("--max-tokens", type=positive_int, metavar="N",
                   help="tokens to generate per prompt (64; unset, it is lowered to what the "
                        "context leaves after the prompt)")
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
                   help="stop at this text (repeatable; the escapes \\n \\t \\r \\\\ \\xHH "
                        "\\uXXXX and the like are understood)")
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
        if path == "-":
            lines = read_lines(sys.stdin, "prompts from stdin")
        else:
            with open(path, "rb") as f:
                lines = read_lines(f, f"prompt file {path!r}")
    except OSError as e:
        raise UsageError(f"cannot read prompt file {path!r}: {e.strerror} (check --file)") from None
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


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"',
            "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_HEX = frozenset("0123456789abcdefABCDEF")
ESCAPES_TEXT = "\\n \\t \\r \\\\ \\' \\\" \\a \\b \\f \\v \\xHH \\uXXXX \\UXXXXXXXX"


def unescape_stop(text: str) -> str:
    """A --stop value with its backslash escapes replaced: \\n, \\t, \\r, \\\\, \\', \\",
    \\a, \\b, \\f, \\v, and \\xHH, \\uXXXX, \\UXXXXXXXX (that code point); every other
    character, non-ASCII ones included, is kept as it is.

    Raises:
        UsageError: an unknown or incomplete escape, or a trailing backslash (names --stop).
    """
    if "\\" not in text:
        return text
    out: List[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        kind = text[i + 1:i + 2]
        if kind in _ESCAPES:
            out.append(_ESCAPES[kind])
            i += 2
            continue
        width = _HEX_DIGITS.get(kind)
        escape = text[i:i + 2 + (width or 0)]
        if not kind:
            what = "a trailing backslash"
        elif not width:
            what = f"an unknown escape '{escape}'"
        elif len(escape) != 2 + width or not all(c in _HEX for c in escape[2:]):
            what = f"'\\{kind}' takes {width} hex digits, got '{escape}'"
        elif int(escape[2:], 16) > 0x10FFFF or 0xD800 <= int(escape[2:], 16) <= 0xDFFF:
            what = f"'{escape}' is not a Unicode character"
        else:
            out.append(chr(int(escape[2:], 16)))
            i += len(escape)
            continue
        shown = text if text.isprintable() else repr(text)[1:-1]
        raise UsageError(f"--stop '{shown}': {what} (escapes understood: {ESCAPES_TEXT}; "
                         f"write \\\\ for a backslash)")
    return "".join(out)


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
        if output.finished:  # a failed request may lack some completions: none will come
            for j in range(self.n):
                self.trackers[(prompt_index, j)].done = True
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
    stops = [unescape_stop(s) for s in args.stop]
    given = {k: getattr(args, k) for k in _SAMPLING_FLAGS if getattr(args, k) is not None}
    given.update(n=args.n, stop=stops, ignore_eos=args.ignore_eos)
    make_sampling_params(given)  # bad flags fail before the model loads
    check_stats_file(args)
    from pagedllm.engine.llm_engine import without_request_id

    engine = build_engine(config)
    start_trace(engine, args)
    stats = None
    unfinished = set()
    try:
        stats = open_stats_file(engine, args)
        defaults = {"max_tokens": DEFAULT_MAX_TOKENS, **engine.generation_defaults()}
        params = make_sampling_params({**defaults, **given})
        usage: List[float] = []
        engine.on_step = lambda s: usage.append(s["used_blocks"] / max(1, s["num_blocks"]))
        start = time.perf_counter()
        index = {}
        for i, prompt in enumerate(prompts):
            try:
                rid = engine.add_request(f"generate-{i}", prompt, params,
                                         default_max_tokens="max_tokens" not in given)
            except ValueError as e:
                message = without_request_id(str(e))
                fix = (length_fix(engine, "lower --max-tokens") if is_length_error(message)
                       else "fix that prompt")
                raise UsageError(f"prompt {i + 1}: {message} ({fix})") from None
            index[rid] = i
            unfinished.add(rid)
        printer = OrderedPrinter(prompts, args.n, holdback_for(stops), not args.no_echo,
                                 sys.stdout)
        first_token: Optional[float] = None
        failed: Dict[int, Tuple[str, str]] = {}  # prompt index -> (request id, why)
        while engine.has_unfinished_requests():
            outs = engine.step()
            for out in outs:
                if first_token is None and any(c.token_ids for c in out.outputs):
                    first_token = time.perf_counter()
                printer.update(index[out.request_id], out)
                if out.finished:
                    unfinished.discard(out.request_id)
                    why = request_failure(out)
                    if why is not None:
                        failed[index[out.request_id]] = (out.request_id, why)
            if stats is not None:
                stats.after_step(outs)
        elapsed = time.perf_counter() - start
    finally:
        end_run(engine, stats, unfinished)  # also on an error or Ctrl-C
    if not args.quiet:
        _report(engine, len(prompts), elapsed, first_token - start if first_token else None, usage)
    # The outputs of every prompt were printed; the failed ones are named last (exit 1).
    return report_failures({f"prompt {i + 1} (request {rid})": why
                            for i, (rid, why) in sorted(failed.items())})


def _report(engine, num_prompts: int, elapsed: float, ttft: Optional[float], usage) -> None:
    gen = engine.num_generation_tokens
    ttft_text = f", first token after {ttft * 1000:.0f} ms" if ttft is not None else ""
    print(f"\n{gen} tokens generated for {num_prompts} prompt{'s' * (num_prompts != 1)} "
          f"({engine.num_prompt_tokens} prompt tokens) in {elapsed:.2f} s: "
          f"{gen / elapsed if elapsed > 0 else 0:.1f} tokens/s{ttft_text}", file=sys.stderr)
    print(kv_summary(engine.kv_cache_stats(), usage), file=sys.stderr)
