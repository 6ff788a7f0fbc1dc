"""Server metrics in the Prometheus text format, with vLLM's names under the ``pagedllm:`` prefix.

Two kinds of figures:
- sampled at scrape time from the engine's published snapshot (AsyncLLMEngine.stats()): the
  gauges kv_cache_usage_perc, num_requests_running / waiting, kv_cache_used_blocks /
  num_blocks, the OOM table's figures (kv_cache_free_blocks, kv_cache_cached_blocks,
  kv_cache_shared_blocks, kv_cache_empty_slots / kv_cache_reserved_slots /
  kv_cache_internal_fragmentation, prefix_cache_hit_rate, preemptions_last_step,
  preemptions_per_step) and the cumulative counters prompt_tokens, generation_tokens,
  prefix_cache_queries, prefix_cache_hits (tokens), num_preemptions, num_swap_outs / ins,
  kv_cache_evictions and kv_cache_cow_copies;
- observed as outputs arrive (on the engine thread): the histograms time_to_first_token_seconds,
  inter_token_latency_seconds (one sample per request per step that gave it new tokens) and
  e2e_request_latency_seconds, and the counter request_success{finished_reason}.

Every series carries the label model_name. Each EngineMetrics owns its registry, so several
servers can live in one process (tests) without clashing. The ``*_created`` series that
prometheus_client adds to counters and histograms are switched off (a process-wide setting), as
vLLM does: they double the output and no dashboard reads them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterable, List

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pagedllm.outputs import RequestOutput

PREFIX = "pagedllm:"

# vLLM's bucket boundaries (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# (metric name without prefix, snapshot key, help text)
_GAUGES = (
    ("num_requests_running", "num_requests_running", "Requests holding KV blocks (scheduled)."),
    ("num_requests_waiting", "num_requests_waiting", "Requests queued (new or preempted)."),
    ("kv_cache_used_blocks", "used_blocks", "KV blocks referenced by a running sequence."),
    ("kv_cache_num_blocks", "num_blocks", "KV blocks in the pool."),
    ("num_requests_swapped", "num_swapped_seqs", "Sequences whose KV blocks are in the host pool."),
    ("disk_records", "disk_records", "Records in the persistent KV store."),
    ("disk_bytes", "disk_bytes", "Bytes of the persistent KV store."),
    ("disk_write_queue", "disk_write_queue", "Blocks waiting to be written to the store."),
    ("disk_load_ms_per_block", "disk_load_ms_per_block",
     "Mean time to read and verify one block from the store (ms)."),
    ("kv_cache_free_blocks", "free_blocks", "KV blocks neither held nor cached."),
    ("kv_cache_cached_blocks", "cached_blocks",
     "KV blocks held by no sequence but kept in the prefix cache (evictable)."),
    ("kv_cache_shared_blocks", "shared_blocks",
     "KV blocks held by more than one sequence (forks, beams, prefix-cache hits)."),
    ("kv_cache_reserved_slots", "slots_reserved", "Token slots in the held KV blocks."),
    ("kv_cache_empty_slots", "slots_empty",
     "Empty token slots in the held KV blocks (internal fragmentation)."),
    ("kv_cache_internal_fragmentation", "internal_fragmentation",
     "Empty slots / slots of the held KV blocks (0..1)."),
    ("prefix_cache_hit_rate", "prefix_cache_hit_rate",
     "Prompt tokens served from the prefix cache / looked up, since start (0..1)."),
    ("preemptions_last_step", "preemptions_last_step", "Sequences preempted in the last step."),
    ("preemptions_per_step", "preemptions_per_step",
     "Mean sequences preempted per step over the preemption-storm window."),
    ("sparse_blocks_read_last_step", "sparse_blocks_read_last_step",
     "KV blocks the last step's decode attention read (per KV head; block-sparse attention)."),
    ("sparse_blocks_held_last_step", "sparse_blocks_held_last_step",
     "KV blocks the last step's decoding sequences held."),
    ("sparse_read_fraction", "sparse_read_fraction",
     "KV blocks read by decode attention / held, since start (1 when dense)."),
)
_COUNTERS = (
    ("prompt_tokens", "num_prompt_tokens", "Prompt tokens of accepted requests."),
    ("generation_tokens", "num_generation_tokens", "Tokens generated."),
    ("prefix_cache_queries", "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    ("prefix_cache_hits", "prefix_cache_hits", "Prompt tokens served from the prefix cache."),
    ("num_preemptions", "num_preemptions", "Sequences preempted (swapped out or freed)."),
    ("num_swap_outs", "num_swap_outs", "Sequences preempted by swapping their blocks out."),
    ("num_swap_ins", "num_swap_ins", "Swapped-out sequences brought back to the device pool."),
    ("kv_cache_evictions", "evictions", "Cached KV blocks evicted from the prefix cache for room."),
    ("kv_cache_cow_copies", "cow_copies", "Copy-on-write copies of shared KV blocks."),
    ("disk_hit_tokens", "disk_hit_tokens", "Prompt tokens loaded from the persistent store."),
    ("disk_lookup_tokens", "disk_lookup_tokens", "Prompt tokens looked up in the store."),
    ("disk_bytes_read", "disk_bytes_read", "Bytes read from the persistent store."),
    ("disk_bytes_written", "disk_bytes_written", "Bytes written to the persistent store."),
    ("disk_failed_writes", "disk_failed_writes", "Writes to the store that failed."),
    ("num_failed_steps", "num_failed_steps", "Steps whose errors failed their requests."),
    ("sparse_blocks_read", "sparse_blocks_read_total",
     "KV blocks read by decode attention (per KV head; all blocks when dense)."),
    ("sparse_blocks_held", "sparse_blocks_held_total",
     "KV blocks held by the decoding sequences, summed over steps."),
    ("sparse_blocks_dropped", "sparse_blocks_dropped",
     "KV blocks freed as they left a streaming window."),
)


class _SnapshotCollector:
    """Yields the scrape-time figures from a stats() callable."""

    def __init__(self, stats: Callable[[], Dict[str, Any]], model_name: str):
        self._stats = stats
        self._model = model_name

    def describe(self) -> Iterable:
        return self._families({}, with_samples=False)

    def collect(self) -> Iterable:
        return self._families(self._stats(), with_samples=True)

    def _families(self, s: Dict[str, Any], with_samples: bool) -> Iterable:
        labels = ["model_name"]
        usage = GaugeMetricFamily(PREFIX + "kv_cache_usage_perc",
                                  "KV-cache usage: used blocks / pool blocks (1 = full).",
                                  labels=labels)
        total = s.get("num_blocks", 0)
        if with_samples:
            usage.add_metric([self._model], s.get("used_blocks", 0) / total if total else 0.0)
        yield usage
        for name, key, doc in _GAUGES:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            if with_samples:
                g.add_metric([self._model], float(s.get(key, 0)))
            yield g
        for name, key, doc in _COUNTERS:
            c = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            if with_samples:
                c.add_metric([self._model], float(s.get(key, 0)))
            yield c


class EngineMetrics:
    """The metrics of one served model.

    Args:
        stats: returns the engine's latest figures (AsyncLLMEngine.stats).
        model_name: value of the model_name label.
    """

    def __init__(self, stats: Callable[[], Dict[str, Any]], model_name: str):
        prometheus_client.disable_created_metrics()
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_SnapshotCollector(stats, model_name))
        labels = ["model_name"]
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds",
                              "Time from arrival to the first generated token.", labels,
                              registry=self.registry, buckets=TTFT_BUCKETS).labels(model_name)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds",
                             "Time between consecutive steps that gave a request new tokens.",
                             labels, registry=self.registry, buckets=ITL_BUCKETS).labels(model_name)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds",
                             "Time from arrival to the finished output.", labels,
                             registry=self.registry, buckets=E2E_BUCKETS).labels(model_name)
        self._success = Counter(PREFIX + "request_success", "Requests ended, by finish reason.",
                                labels + ["finished_reason"], registry=self.registry)
        self._lock = threading.Lock()
        self._last: Dict[str, tuple] = {}  # request id -> (tokens so far, time of last new tokens)

    def on_outputs(self, outputs: List[RequestOutput], now: float) -> None:
        """Observes one step's outputs (AsyncLLMEngine's on_outputs hook).

        Args:
            outputs: the cumulative outputs of the requests that advanced.
            now: time.monotonic() when the step returned.
        """
        with self._lock:
            for out in outputs:
                num_tokens = sum(len(c.token_ids) for c in out.outputs)
                seen, last_time = self._last.get(out.request_id, (0, None))
                if num_tokens > seen:
                    if seen == 0:
                        first = out.metrics.get("first_token_time", now)
                        self.ttft.observe(max(0.0, first - out.metrics.get("arrival_time", first)))
                    else:
                        self.itl.observe(max(0.0, now - last_time))
                    seen, last_time = num_tokens, now
                if out.finished:
                    self._last.pop(out.request_id, None)
                    end = out.metrics.get("finish_time", now)
                    self.e2e.observe(max(0.0, end - out.metrics.get("arrival_time", end)))
                    reason = out.outputs[0].finish_reason if out.outputs else "stop"
                    self._success.labels(self.model_name, reason or "stop").inc()
                else:
                    self._last[out.request_id] = (seen, last_time)

    def on_abort(self, request_id: str) -> None:
        """Counts an aborted request (AsyncLLMEngine's on_abort hook)."""
        with self._lock:
            self._last.pop(request_id, None)
            self._success.labels(self.model_name, "abort").inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE_LATEST
