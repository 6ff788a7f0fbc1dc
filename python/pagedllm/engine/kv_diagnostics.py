"""KV-pool diagnostics: the seed's OOM table as messages, from plain stats dicts.

The table (docs/USAGE.md, "When the KV pool runs out"):

==========================  ================================  ===================================
symptom                     likely cause                      knob (pagedllm / vLLM)
==========================  ================================  ===================================
short sequences OOM         block too large (internal         block_size / --block-size (same)
                            fragmentation: empty slots in
                            held blocks)
long sequences OOM          too few blocks                    num_kv_blocks, kv_cache_memory_bytes,
                                                              gpu_memory_utilization /
                                                              num_gpu_blocks_override,
                                                              gpu_memory_utilization; or lower
                                                              max_model_len, max_num_seqs
OOM under concurrency       prefix sharing not working        enable_prefix_caching (same); equal
                                                              prompt prefixes, same extra_key
                                                              (cache_salt)
==========================  ================================  ===================================

Everything here is a pure function of stats dicts (``KVCacheManager.stats()`` plus the engine's
figures) except ``PreemptionMonitor``, which keeps a window of per-step preemption counts and
rate-limits its warning. ``LLMEngine`` calls ``admission_error`` from ``_validate`` (a request
that can never fit) and ``PreemptionMonitor.observe`` after each schedule.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import numpy as np

from pagedllm.engine.kv_sizing import seed_rule, watermark_block_count

logger = logging.getLogger("pagedllm")

SHORT_OOM = "short sequences run out of KV blocks"
LONG_OOM = "long sequences run out of KV blocks"
CONCURRENCY_OOM = "the KV pool runs out under concurrency"

# A sequence is "short" when it spans fewer than this many blocks.
SHORT_SEQ_BLOCKS = 4
# Internal fragmentation (empty slots / reserved slots) from which blocks count as too large.
FRAGMENTATION_TOO_HIGH = 0.25
# Running requests from which a full pool counts as "under concurrency".
CONCURRENT_REQUESTS = 8
# Shared blocks / used blocks under which prefix sharing counts as not working.
SHARING_TOO_LOW = 0.05


@dataclass
class Diagnosis:
    """One row of the OOM table applied to figures.

    Attributes:
        symptom: what is seen (SHORT_OOM, LONG_OOM, CONCURRENCY_OOM).
        cause: the likely cause, with the figure that points to it.
        knob: what to change (pagedllm's option names, flags in parentheses).
        numbers: the pool's figures.
    """

    symptom: str
    cause: str
    knob: str
    numbers: str

    def message(self) -> str:
        return f"{self.symptom}: {self.numbers}. Likely cause: {self.cause}. Knob: {self.knob}"


def fragmentation(stats: Dict) -> float:
    """Internal fragmentation: empty slots in held blocks / slots reserved (0 when none)."""
    reserved = stats.get("slots_reserved", 0)
    return stats.get("slots_empty", 0) / reserved if reserved else 0.0


def hit_rate(stats: Dict) -> float:
    """Prefix-cache hit rate: prompt tokens served from the cache / prompt tokens looked up."""
    q = stats.get("prefix_cache_queries", 0)
    return stats.get("prefix_cache_hits", 0) / q if q else 0.0


def count_shared_blocks(tables, refcount: Optional[Callable[[int], int]] = None) -> int:
    """Blocks held by more than one sequence (forks, beams, prefix-cache hits).

    Args:
        tables: the live sequences' block tables: an iterable of 1-D arrays, or one 2-D array
            padded with 0 (KVCacheManager.block_tables), in which case block 0 is judged by
            `refcount` (the padding makes its count ambiguous).
        refcount: the manager's refcount (sequences holding a block); needed for a padded array.
    Returns:
        The number of distinct blocks that appear in two tables or more.
    """
    if isinstance(tables, np.ndarray) and tables.ndim == 2:
        flat = tables.ravel()
        flat = flat[flat != 0]
        zero = 1 if refcount is not None and tables.size and refcount(0) > 1 else 0
    else:
        arrays = [np.asarray(t, dtype=np.int64).ravel() for t in tables]
        flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        zero = 0
    if not flat.size:
        return zero
    _, counts = np.unique(flat, return_counts=True)
    return int((counts > 1).sum()) + zero


def pool_numbers(stats: Dict, need: Optional[int] = None) -> str:
    """The pool's figures in one phrase: needed vs free, cached, fragmentation, shared."""
    parts = []
    if need is not None:
        parts.append(f"{need} blocks needed")
    parts.append(f"{stats.get('free_blocks', 0)} free of {stats.get('num_blocks', 0)} "
                 f"(block_size {stats.get('block_size', '?')})")
    parts.append(f"{stats.get('cached_blocks', 0)} cached (evictable)")
    parts.append(f"{stats.get('used_blocks', 0)} held")
    parts.append(f"internal fragmentation {stats.get('slots_empty', 0)} empty slots in held "
                 f"blocks ({100 * fragmentation(stats):.1f}%)")
    parts.append(f"{stats.get('shared_blocks', 0)} shared blocks")
    parts.append(f"prefix-cache hit rate {100 * hit_rate(stats):.1f}%")
    return ", ".join(parts)


_MORE_BLOCKS = ("raise num_kv_blocks or kv_cache_memory_bytes (--num-kv-blocks, --kv-cache-memory; "
                "on a GPU gpu_memory_utilization), or lower max_num_seqs or max_model_len")


def diagnose_pressure(stats: Dict, num_running: int, mean_seq_len: float,
                      prefix_caching: bool) -> Diagnosis:
    """Which row of the table a full pool (preemptions) matches.

    Args:
        stats: KVCacheManager.stats() plus "shared_blocks".
        num_running: requests running.
        mean_seq_len: mean tokens of the running sequences.
        prefix_caching: whether enable_prefix_caching is on.
    Returns:
        The diagnosis; short sequences with high fragmentation first, then concurrency without
        sharing, else long sequences.
    """
    bs = int(stats.get("block_size", 16))
    frag = fragmentation(stats)
    numbers = (f"{num_running} requests running, mean sequence {mean_seq_len:.0f} tokens; "
               + pool_numbers(stats))
    if mean_seq_len < SHORT_SEQ_BLOCKS * bs and frag >= FRAGMENTATION_TOO_HIGH:
        auto = ""  # "auto" never goes under 16: named only where its rule gives less than now
        if seed_rule(mean_seq_len) < bs:
            auto = (f", or block_size=auto with expected_mean_seq_len={int(mean_seq_len)}: "
                    f"{seed_rule(mean_seq_len)}")
        return Diagnosis(
            SHORT_OOM,
            f"block too large: sequences of ~{mean_seq_len:.0f} tokens in blocks of {bs} leave "
            f"{100 * frag:.0f}% of the held slots empty",
            f"lower block_size (now {bs}, e.g. {max(1, bs // 2)}{auto}); set by kv_cache_memory_bytes, "
            f"the same memory then holds more blocks (with num_kv_blocks, keep the tokens: "
            f"raise it as block_size falls)", numbers)
    used = stats.get("used_blocks", 0)
    shared = stats.get("shared_blocks", 0)
    if num_running >= CONCURRENT_REQUESTS and (not used or shared / used < SHARING_TOO_LOW):
        if not prefix_caching:
            cause = ("prefix sharing is off (enable_prefix_caching=False): requests with a "
                     "common prompt prefix each hold their own copy of it")
            knob = ("turn on enable_prefix_caching (--enable-prefix-caching); if the prompts "
                    "share nothing, " + _MORE_BLOCKS)
        else:
            cause = (f"prefix sharing is not working (enable_prefix_caching is on): {shared} of "
                     f"{used} held blocks shared across {num_running} requests, hit rate "
                     f"{100 * hit_rate(stats):.1f}%")
            knob = ("give prompts meant to share a prefix the identical leading tokens (a "
                    "whole block at least) and the same extra_key / cache salt; if they share "
                    "nothing, " + _MORE_BLOCKS)
        return Diagnosis(CONCURRENCY_OOM, cause, knob, numbers)
    return Diagnosis(LONG_OOM, f"too few blocks for {num_running} sequences of ~"
                     f"{mean_seq_len:.0f} tokens", _MORE_BLOCKS, numbers)


def blocks_to_admit(need_blocks: int, admit_blocks: int, watermark: float) -> int:
    """The fewest pool blocks that admit a request: at least `need_blocks` in all, and
    `admit_blocks` left after the watermark the engine keeps of that pool
    (kv_sizing.watermark_block_count)."""
    # n - int(watermark n) grows with n and is below n (1 - watermark) + 1: no n under
    # (admit - 1) / (1 - watermark) admits, so the search starts there
    n = max(need_blocks, admit_blocks, 1, int((admit_blocks - 1) / (1.0 - watermark)))
    while n - watermark_block_count(watermark, n) < admit_blocks:
        n += 1
    return n


def admission_error(request_id: str, prompt_tokens: int, total_tokens: int, need_blocks: int,
                    admit_blocks: int, num_blocks: int, watermark_blocks: int, block_size: int,
                    bytes_per_block: int, stats: Dict, watermark: float = 0.0,
                    sized_by_blocks: bool = False) -> str:
    """The add_request error of a request that can never fit the pool.

    A single request is refused only for too few blocks, never for their size: it needs
    ceil(tokens / block_size) blocks, which fit exactly when its tokens fit the pool's slots.
    What does not fit is the whole sequence, or its prompt once the watermark is kept free.

    Args:
        request_id: the request.
        prompt_tokens: its prompt's length.
        total_tokens: prompt + max_tokens.
        need_blocks: blocks its whole sequence needs.
        admit_blocks: blocks its prompt needs to be admitted.
        num_blocks, watermark_blocks, block_size, bytes_per_block: the pool.
        stats: KVCacheManager.stats() (with "shared_blocks" if known).
        watermark: the watermark fraction (EngineConfig.watermark) the pool was sized with.
        sized_by_blocks: num_kv_blocks set the pool (KVPlan.sized_by_blocks): a byte budget
            would be ignored, so only num_kv_blocks is advised.
    Returns:
        "request <id>: <symptom>: <numbers>. Likely cause: ... Knob: ..."; its figures are ones
        that work: the num_kv_blocks it names admits the request.
    """
    usable = num_blocks - watermark_blocks
    head = (f"{total_tokens} tokens need {need_blocks} KV blocks but the pool has {num_blocks} "
            f"(block_size {block_size}; its prompt of {prompt_tokens} tokens needs {admit_blocks} "
            f"to be admitted, {usable} admissible with watermark {watermark_blocks}); "
            + pool_numbers(stats, need_blocks))
    want = blocks_to_admit(need_blocks, admit_blocks, watermark)
    knobs = [f"raise num_kv_blocks to at least {want}" + (
        "" if sized_by_blocks else
        f" or kv_cache_memory_bytes to at least {want * bytes_per_block}")]
    if admit_blocks > usable:  # the prompt alone: max_tokens cannot help
        cause = (f"the prompt needs {admit_blocks} blocks and the watermark keeps "
                 f"{watermark_blocks} of the {num_blocks} free, leaving {usable}")
        if admit_blocks <= num_blocks:
            most = math.floor((num_blocks - admit_blocks) / num_blocks * 1e4) / 1e4
            knobs.append(f"lower watermark to at most {most:g}")
        knobs.append("shorten the prompt")
    else:
        cause = f"too few blocks: {num_blocks} blocks hold {num_blocks * block_size} tokens"
        room = num_blocks * block_size - prompt_tokens
        if room >= 1:
            knobs.append(f"lower max_tokens to at most {room}")
    d = Diagnosis(LONG_OOM, cause, ", or ".join(knobs), head)
    return f"request {request_id}: {d.message()}"


class PreemptionMonitor:
    """Watches preemptions per step and warns, rate-limited, when they storm.

    Args:
        window_steps: steps in the sliding window.
        threshold: preemptions within the window that make a storm.
        interval_s: at most one warning per this many seconds.
        clock: time source (tests pass a fake one).
    """

    def __init__(self, window_steps: int = 32, threshold: int = 16, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.window_steps = window_steps
        self.threshold = threshold
        self.interval_s = interval_s
        self.clock = clock
        self._window: collections.deque = collections.deque(maxlen=window_steps)
        self._total = 0
        self._last_warning: Optional[float] = None
        self.last_step = 0  # preemptions of the latest step
        self.num_warnings = 0
        self.last_diagnosis: Optional[Diagnosis] = None

    @property
    def per_step(self) -> float:
        """Mean preemptions per step over the window."""
        return sum(self._window) / len(self._window) if self._window else 0.0

    def observe(self, total_preemptions: int,
                diagnose: Callable[[], Diagnosis]) -> Optional[Diagnosis]:
        """Feeds one step's cumulative preemption count.

        Args:
            total_preemptions: the scheduler's num_preemptions after the step's schedule.
            diagnose: called only when a warning is due (it may walk block tables).
        Returns:
            The diagnosis that was logged, or None.
        """
        n = max(0, total_preemptions - self._total)
        self._total = total_preemptions
        self.last_step = n
        self._window.append(n)
        if not n or sum(self._window) < self.threshold:
            return None
        now = self.clock()
        if self._last_warning is not None and now - self._last_warning < self.interval_s:
            return None
        self._last_warning = now
        d = diagnose()
        self.last_diagnosis = d
        self.num_warnings += 1
        logger.warning("preemption storm: %d preemptions in the last %d steps (%.2f per step); "
                       "%s (next warning in %.0f s at the earliest)", sum(self._window),
                       len(self._window), self.per_step, d.message(), self.interval_s)
        return d
