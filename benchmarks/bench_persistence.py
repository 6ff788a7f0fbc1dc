"""Time to first token of a long prompt seen before a restart: loaded from the persistent KV
tier vs recomputed.

For each (model, prompt length): engine A (persistence on, empty store) computes the prompt
and writes its blocks; A is shut down (a restart: nothing stays in memory); engine B on the
same store serves the same prompt (its blocks come from disk) and engine C without persistence
recomputes it. TTFT = wall time of a request with max_tokens=1, median of `repeats` fresh
engines for B and C (each starts with an empty memory cache). Also reported: the store's write
throughput during A and the first-token tokens agreeing between B and C.

Usage: python -m benchmarks.bench_persistence [--quick]
Writes benchmarks/results/persistence.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Tuple

from benchmarks.common import checkpoint, machine_info, write_results


@dataclass
class PersistenceBenchConfig:
    """Cases (model preset, prompt tokens) and repetitions."""

    cases: List[Tuple[str, int]] = field(default_factory=lambda: [("tiny", 8192),
                                                                  ("small", 2048)])
    repeats: int = 5
    block_size: int = 16

    @classmethod
    def quick(cls) -> "PersistenceBenchConfig":
        return cls(cases=[("tiny", 512)], repeats=1)


def _engine(path: str, store: str, bs: int, tokens: int):
    from pagedllm import LLM

    kw = dict(block_size=bs, num_kv_blocks=tokens // bs + 64, max_num_batched_tokens=2048,
              max_model_len=tokens + 16)
    if store:
        kw["persistence"] = {"storage_path": store}
    else:
        kw["enable_prefix_caching"] = False
    return LLM(path, **kw)


def _ttft(llm, prompt) -> Tuple[float, int]:
    from pagedllm import SamplingParams

    # Warm the engine (first-call costs of torch and oneDNN) on an unrelated prompt.
    warm = [(11 * i) % 3000 + 5 for i in range(64)]
    llm.generate([{"prompt_token_ids": warm}], SamplingParams(temperature=0.0, max_tokens=1),
                 use_tqdm=False)
    t0 = time.perf_counter()
    (out,) = llm.generate([{"prompt_token_ids": prompt}],
                          SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    return time.perf_counter() - t0, out.outputs[0].token_ids[0]


def measure(cfg: PersistenceBenchConfig) -> dict:
    """Runs every case. Returns {"rows": [...]}."""
    rows = []
    for preset, n in cfg.cases:
        path = checkpoint(dict(checkpoint_preset(preset), max_position_embeddings=max(n + 64, 4096)))
        prompt = [(7 * i) % 4000 + 3 for i in range(n)]
        store = tempfile.mkdtemp(prefix="pagedllm-kv-")
        try:
            a = _engine(path, store, cfg.block_size, n)
            t0 = time.perf_counter()
            first_a, tok_a = _ttft(a, prompt)
            a.engine.tier.flush(120)
            write_s = time.perf_counter() - t0 - first_a
            written = a.kv_cache_stats()["disk_bytes_written"]
            a.engine.shutdown()
            loaded, recomputed, agree = [], [], True
            for _ in range(cfg.repeats):
                b = _engine(path, store, cfg.block_size, n)
                t, tok_b = _ttft(b, prompt)
                hits = b.kv_cache_stats()["disk_hit_tokens"]
                b.engine.shutdown()
                loaded.append(t)
                c = _engine(path, "", cfg.block_size, n)
                t, tok_c = _ttft(c, prompt)
                recomputed.append(t)
                agree &= tok_b == tok_c == tok_a
            row = {"model": preset, "prompt_tokens": n, "ttft_loaded_s": statistics.median(loaded),
                   "ttft_recomputed_s": statistics.median(recomputed),
                   "speedup": statistics.median(recomputed) / statistics.median(loaded),
                   "disk_hit_tokens": hits, "bytes_written": written,
                   "write_mb_s_after_step": written / max(write_s, 1e-9) / 1e6,
                   "first_tokens_agree": agree}
            print(f"{preset} {n} tokens: TTFT loaded {row['ttft_loaded_s'] * 1e3:.1f} ms, "
                  f"recomputed {row['ttft_recomputed_s'] * 1e3:.1f} ms "
                  f"({row['speedup']:.1f}x), {hits} tokens from disk, agree={agree}", flush=True)
            rows.append(row)
        finally:
            shutil.rmtree(store, ignore_errors=True)
    return {"rows": rows, "machine": machine_info(), "config": cfg.__dict__}


def checkpoint_preset(name: str) -> dict:
    from pagedllm.model.checkpoint import PRESETS

    return dict(PRESETS[name])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cfg = PersistenceBenchConfig.quick() if args.quick else PersistenceBenchConfig()
    write_results("persistence", measure(cfg))


if __name__ == "__main__":
    main()
