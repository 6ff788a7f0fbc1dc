"""Watch a running server's live figures, read from its /metrics, or an offline run's, read
from the file `pagedllm generate --stats-file FILE` keeps (the same figures).

Refreshes in place every --interval seconds (Ctrl-C stops); --once prints one snapshot. Rates
(tokens/s) need two snapshots and show as "-" on the first. A server (or file) that cannot be
read, or that holds no pagedllm figures, at the first refresh is an error (exit 1), and so is a
--metric it does not have; later, the screen says so (the server unreachable, the file
unreadable, a metric missing) and the monitor keeps trying.

metrics (--metric, repeatable or comma-separated; default: all):
  cache_usage     KV-cache usage (used blocks / pool), with a bar
  running         requests running          waiting      requests waiting
  preemptions     preemptions so far        prefix_hits  prefix-cache hit rate (prompt tokens)
  gen_throughput  generated tokens/s        prompt_throughput  prompt tokens/s
  ttft            mean time to first token  itl          mean inter-token latency
  e2e             mean request latency      requests     requests finished, by reason
  swapped         sequences in the host pool
  free_blocks     free KV blocks            cached_blocks  cached (evictable) KV blocks
  fragmentation   empty slots in held blocks (internal fragmentation)
  shared_blocks   blocks held by more than one sequence
  evictions       prefix-cache evictions    cow_copies   copy-on-write copies
  preemption_rate preemptions in the last step and per step (storm window)
  disk_hits       prompt tokens loaded from the persistent store / looked up there
  or any metric name of /metrics (with or without the 'pagedllm:' prefix; a counter also
  without _total; a histogram by its base name: its mean (_sum / _count) and count)

examples:
  pagedllm monitor --metric=cache_usage
  pagedllm monitor --url http://10.0.0.5:8000 --metric running,waiting,gen_throughput --interval 2
  pagedllm generate --stats-file run.prom --file prompts.txt &
  pagedllm monitor --stats-file run.prom
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Dict, List, Optional, Tuple

from pagedllm.commands import HELPS
from pagedllm.commands.errors import CliError, UsageError

NAME = "monitor"
HELP = HELPS[NAME]
P = "pagedllm:"

Samples = Dict[str, float]  # "name{label=value,...}" or "name" -> value, summed over labels
Snapshot = Tuple[float, Samples]  # (time, samples)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None,
                   help="the server's base URL (http://127.0.0.1:8000)")
    p.add_argument("--stats-file", metavar="FILE",
                   help="read an offline run's figures from FILE (written by `pagedllm generate "
                        "--stats-file FILE`) instead of a server")
    p.add_argument("--metric", action="append", default=[], metavar="NAME",
                   help="what to show (repeatable, comma-separated; default: all)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes (1)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N refreshes (0: never)")
    p.add_argument("--api-key", metavar="KEY",
                   help="the server's API key (/metrics is behind it unless the server runs "
                        "with --metrics-public); default: $PAGEDLLM_API_KEY")


def fetch(url: str, timeout: float = 5.0, api_key: Optional[str] = None) -> Samples:
    """Scrapes <url>/metrics (sending the API key when given); see parse()."""
    target = url.rstrip("/") + "/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    offline = ("; for an offline run, write `pagedllm generate --stats-file FILE` and read it "
               "with `pagedllm monitor --stats-file FILE`")
    try:
        with urllib.request.urlopen(urllib.request.Request(target, headers=headers),
                                    timeout=timeout) as resp:
            text = resp.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise CliError(f"{target} needs the server's API key: pass --api-key or set "
                           "PAGEDLLM_API_KEY") from None
        raise CliError(f"{target} answered HTTP {e.code} (is --url a pagedllm server?)") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CliError(f"cannot reach {target}: {reason} (the monitor needs a running server: "
                       f"is `pagedllm serve` running there? check --url{offline})") from None
    try:
        samples = parse(text)
    except ValueError as e:
        raise CliError(f"{target} is not in the Prometheus text format ({e}); is --url a "
                       "pagedllm server?") from None
    if not has_figures(samples):
        raise CliError(f"{target} holds no pagedllm figures ({_what_else(samples)}; is --url "
                       "a pagedllm server?)")
    return samples


def read_stats_file(path: str) -> Tuple[float, Samples]:
    """(the time the file was written, its samples) of a `generate --stats-file` file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        written = os.stat(path).st_mtime
    except FileNotFoundError:
        raise CliError(f"stats file {path!r} not found (write it with `pagedllm generate "
                       "--stats-file FILE ...`; check --stats-file)") from None
    except OSError as e:
        raise CliError(f"cannot read stats file {path!r}: {e.strerror}") from None
    expected = "expected a file written by `pagedllm generate --stats-file` or `pagedllm bench "\
        "--stats-file`; check --stats-file"
    try:
        samples = parse(text)
    except ValueError as e:
        raise CliError(f"stats file {path!r} is not in the Prometheus text format ({e}); "
                       f"{expected}") from None
    if not has_figures(samples):
        what = "it is empty" if not text.strip() else _what_else(samples)
        raise CliError(f"stats file {path!r} holds no pagedllm figures ({what}; {expected})")
    return written, samples


def has_figures(samples: Samples) -> bool:
    """Whether a scrape holds any pagedllm figure (a 'pagedllm:' metric)."""
    return any(name.startswith(P) for name in samples)


def _what_else(samples: Samples) -> str:
    """What a scrape without pagedllm figures holds, for the error message."""
    names = sorted({name.split("{", 1)[0] for name in samples})
    if not names:
        return "no metric at all"
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"only {len(names)} other metric{'s' * (len(names) != 1)}: {shown}"


def parse(text: str) -> Samples:
    """Samples of a Prometheus text exposition, summed over label sets and also kept per
    label set (model_name left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + s.value
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            if labels:
                key = f"{s.name}{{{labels}}}"
                samples[key] = samples.get(key, 0.0) + s.value
    return samples


def _rate(name: str) -> Callable:
    def f(cur: Snapshot, prev: Optional[Snapshot]) -> str:
        if prev is None or cur[0] <= prev[0]:
            return "-"
        return f"{(cur[1].get(name, 0.0) - prev[1].get(name, 0.0)) / (cur[0] - prev[0]):.1f}/s"
    return f


def _mean(name: str, unit_ms: bool = True) -> Callable:
    def f(cur: Snapshot, prev: Optional[Snapshot]) -> str:
        n = cur[1].get(name + "_count", 0.0)
        if not n:
            return "-"
        mean = cur[1].get(name + "_sum", 0.0) / n
        return f"{mean * 1000:.1f} ms" if unit_ms else f"{mean:.3f} s"
    return f


def _usage(cur: Snapshot, prev: Optional[Snapshot]) -> str:
    frac = cur[1].get(P + "kv_cache_usage_perc", 0.0)
    used, total = cur[1].get(P + "kv_cache_used_blocks", 0.0), cur[1].get(P + "kv_cache_num_blocks", 0.0)
    width = 30
    filled = min(width, int(round(frac * width)))
    return f"[{'#' * filled}{'.' * (width - filled)}] {100 * frac:5.1f}%  ({used:.0f}/{total:.0f} blocks)"


def _plain(name: str) -> Callable:
    return lambda cur, prev: f"{cur[1].get(name, 0.0):.0f}"


def _hit_rate(queries: str, hits: str) -> Callable:
    """A view of hits / queries (two token counters) as a percentage."""
    def f(cur: Snapshot, prev: Optional[Snapshot]) -> str:
        q, h = cur[1].get(P + queries, 0.0), cur[1].get(P + hits, 0.0)
        return f"{100 * h / q:.1f}% ({h:.0f}/{q:.0f} tokens)" if q else "-"
    return f


_hits = _hit_rate("prefix_cache_queries_total", "prefix_cache_hits_total")
_disk_hits = _hit_rate("disk_lookup_tokens_total", "disk_hit_tokens_total")


def _fragmentation(cur: Snapshot, prev: Optional[Snapshot]) -> str:
    empty = cur[1].get(P + "kv_cache_empty_slots", 0.0)
    slots = cur[1].get(P + "kv_cache_reserved_slots", 0.0)
    return f"{100 * empty / slots:.1f}% ({empty:.0f} empty of {slots:.0f} slots)" if slots else "-"


def _preemption_rate(cur: Snapshot, prev: Optional[Snapshot]) -> str:
    last = cur[1].get(P + "preemptions_last_step", 0.0)
    mean = cur[1].get(P + "preemptions_per_step", 0.0)
    return f"{last:.0f} last step, {mean:.2f} per step"


def _requests(cur: Snapshot, prev: Optional[Snapshot]) -> str:
    prefix = P + "request_success_total{"
    parts = [f"{k[len(prefix):].split('=', 1)[1].rstrip('}')} {v:.0f}"
             for k, v in sorted(cur[1].items()) if k.startswith(prefix)]
    return ", ".join(parts) or "0"


VIEWS: Dict[str, Tuple[str, Callable]] = {
    "cache_usage": ("KV cache usage", _usage),
    "running": ("requests running", _plain(P + "num_requests_running")),
    "waiting": ("requests waiting", _plain(P + "num_requests_waiting")),
    "preemptions": ("preemptions", _plain(P + "num_preemptions_total")),
    "prefix_hits": ("prefix cache hits", _hits),
    "gen_throughput": ("generation", _rate(P + "generation_tokens_total")),
    "prompt_throughput": ("prompt", _rate(P + "prompt_tokens_total")),
    "ttft": ("mean TTFT", _mean(P + "time_to_first_token_seconds")),
    "itl": ("mean inter-token", _mean(P + "inter_token_latency_seconds")),
    "e2e": ("mean latency", _mean(P + "e2e_request_latency_seconds", unit_ms=False)),
    "requests": ("requests finished", _requests),
    "swapped": ("sequences swapped", _plain(P + "num_requests_swapped")),
    "disk_hits": ("disk tier hits", _disk_hits),
    "free_blocks": ("free blocks", _plain(P + "kv_cache_free_blocks")),
    "cached_blocks": ("cached blocks (evictable)", _plain(P + "kv_cache_cached_blocks")),
    "fragmentation": ("internal fragmentation", _fragmentation),
    "shared_blocks": ("shared blocks", _plain(P + "kv_cache_shared_blocks")),
    "evictions": ("evictions", _plain(P + "kv_cache_evictions_total")),
    "cow_copies": ("copy-on-write copies", _plain(P + "kv_cache_cow_copies_total")),
    "preemption_rate": ("preemptions per step", _preemption_rate),
}


class MissingMetric(CliError):
    """A --metric name that the figures do not hold.

    Args:
        name: the name as given to --metric.
    """

    def __init__(self, name: str):
        super().__init__(f"no metric {name!r} in the figures (known views: {', '.join(VIEWS)}; "
                         "or a name listed by /metrics: a gauge, a counter with or without "
                         "_total, a histogram by its base name)")
        self.name = name


def _histogram_mean(samples: Samples, base: str) -> str:
    """A histogram's mean (_sum / _count) and count; in ms for a name in seconds."""
    count = samples[base + "_count"]
    if not count:
        return "- (0 observed)"
    mean = samples.get(base + "_sum", 0.0) / count
    shown = f"{mean * 1000:.1f} ms" if base.endswith("_seconds") else f"{mean:g}"
    return f"mean {shown} ({count:.0f} observed)"


def raw_metric_view(name: str) -> Callable:
    """The formatter of a metric of /metrics given by name: a gauge or counter sample (summed
    over its labels, or one labelled series such as 'request_success_total{finished_reason=
    error}'), a counter without its _total, or a histogram (or summary) by its base name.

    Args:
        name: the name as given to --metric, with or without the 'pagedllm:' prefix.
    Returns:
        f(cur, prev) -> the text shown; it raises MissingMetric when the figures lack the name.
    """
    candidates = [name] if name.startswith(P) else [P + name, name]

    def view(cur: Snapshot, prev: Optional[Snapshot]) -> str:
        samples = cur[1]
        for raw in candidates:
            if raw in samples:
                return f"{samples[raw]:g}"
            if raw + "_total" in samples:
                return f"{samples[raw + '_total']:g}"
            if raw + "_count" in samples:
                return _histogram_mean(samples, raw)
        raise MissingMetric(name)
    return view


def resolve_metrics(names: List[str]) -> List[Tuple[str, Callable]]:
    """The (label, formatter) of each requested metric, in order (default: all views)."""
    wanted = [n.strip() for arg in names for n in arg.split(",") if n.strip()] or list(VIEWS)
    return [VIEWS[name] if name in VIEWS else (name, raw_metric_view(name)) for name in wanted]


def render(url: str, views, cur: Snapshot, prev: Optional[Snapshot],
           missing_ok: bool = False) -> List[str]:
    """The lines of one screen.

    Args:
        url: the source shown in the header.
        views: (label, formatter) pairs of resolve_metrics().
        cur: this refresh's snapshot.
        prev: the previous one (None: the first refresh).
        missing_ok: a metric the figures lack shows as missing instead of raising.
    Returns:
        The header line, then one line per view.
    Raises:
        MissingMetric: a metric the figures lack (unless missing_ok).
    """
    width = max(len(label) for label, _ in views)
    lines = [f"pagedllm monitor: {url}  ({time.strftime('%H:%M:%S')})"]
    for label, fmt in views:
        try:
            value = fmt(cur, prev)
        except MissingMetric:
            if not missing_ok:
                raise
            value = "- (missing: not in the figures of this refresh)"
        lines.append(f"  {label:<{width}}  {value}")
    return lines


def check_url(url: str) -> None:
    """Raises UsageError unless `url` is a server's base URL, http(s)://host[:port][/path]."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError as e:
        raise UsageError(f"--url {url!r} is not a valid URL: {e} (expected "
                         "http(s)://host:port, e.g. http://127.0.0.1:8000)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {url!r} is not an http(s) URL (expected http(s)://host:port, "
                         "e.g. http://127.0.0.1:8000)")


def run(args: argparse.Namespace) -> int:
    if not (args.interval > 0 and math.isfinite(args.interval)):
        raise UsageError(f"--interval must be a finite number of seconds > 0, got "
                         f"{args.interval}")
    if args.count < 0:
        raise UsageError(f"--count must be >= 0, got {args.count} (0: refresh until Ctrl-C)")
    if args.stats_file and args.url:
        raise UsageError("give --url (a server) or --stats-file (an offline run), not both")
    if args.url is not None:
        check_url(args.url)
    views = resolve_metrics(args.metric)
    api_key = args.api_key or os.environ.get("PAGEDLLM_API_KEY") or None
    source = args.stats_file or args.url or "http://127.0.0.1:8000"
    if args.stats_file:
        def snapshot() -> Snapshot:
            return read_stats_file(args.stats_file)
    else:
        def snapshot() -> Snapshot:
            return time.monotonic(), fetch(source, api_key=api_key)
    tty = sys.stdout.isatty()
    prev: Optional[Snapshot] = None
    drawn = 0
    refreshes = 0
    while True:
        try:
            cur = snapshot()
        except CliError as e:
            if prev is None:
                raise
            cur = None
            lines = [f"pagedllm monitor: {source}  ({time.strftime('%H:%M:%S')})",
                     f"  {'unreadable' if args.stats_file else 'unreachable'}: {e}"]
        else:
            label = source
            if args.stats_file:
                written = time.strftime("%H:%M:%S", time.localtime(cur[0]))
                label += f", an offline run written at {written}"
            # A --metric the first figures lack is an error; one gone later shows as missing.
            lines = render(label, views, cur, prev, missing_ok=prev is not None)
        if tty and drawn:
            sys.stdout.write(f"\x1b[{drawn}F\x1b[J")  # back to the first line, clear below
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        drawn = len(lines)
        refreshes += 1
        if args.once or (args.count and refreshes >= args.count):
            return 0
        prev = cur or prev
        time.sleep(args.interval)
