"""Human-readable figures shared by generate and bench."""

from __future__ import annotations

from typing import Dict, Sequence

from pagedllm.commands.common import format_bytes


def kv_summary(stats: Dict, usage_samples: Sequence[float]) -> str:
    """One line about the KV pool: size, peak and mean usage, prefix-cache hits, preemptions.

    Args:
        stats: LLMEngine.kv_cache_stats().
        usage_samples: used_blocks / num_blocks sampled at every step.
    """
    total = stats.get("num_blocks", 0)
    peak = stats.get("peak_used_blocks", 0)
    size = stats.get("kv_cache_bytes")
    dtype = stats.get("kv_cache_dtype", "")
    pool = f"{total} blocks of {stats.get('block_size', '?')} tokens"
    if size is not None:
        pool += f" ({format_bytes(size)}{', ' + dtype if dtype else ''})"
    mean = sum(usage_samples) / len(usage_samples) if usage_samples else 0.0
    queries = stats.get("prefix_cache_queries", 0)
    hits = stats.get("prefix_cache_hits", 0)
    rate = f" ({100 * hits / queries:.0f}%)" if queries else ""
    return (f"KV cache: {pool}; peak {peak} used ({100 * peak / max(1, total):.1f}%), mean "
            f"{100 * mean:.1f}% over {len(usage_samples)} steps; prefix cache hits {hits} of "
            f"{queries} prompt tokens{rate}; {stats.get('num_preemptions', 0)} preemptions")
