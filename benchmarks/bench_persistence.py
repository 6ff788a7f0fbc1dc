"""Time to first token of a long prompt seen before a restart: loaded from the persistent KV
tier vs recomputed; a Zipf trace over long documents across a restart (P50/P99); and the
throughput cost of writing every block on a workload with no reuse.

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


def measure_trace(preset: str = "tiny", docs: int = 12, doc_tokens: Tuple[int, int] = (2048, 4096),
                  requests: int = 48, zipf_a: float = 1.2, pool_docs: float = 2.5,
                  bs: int = 16, seed: int = 0) -> dict:
    """The seed's scenario, scaled to this CPU: requests over long documents with Zipf
    popularity (a document + a fresh 16-token question each), a KV pool that holds about
    `pool_docs` documents, served one at a time; first half before a restart, second half after.
    P50/P99 TTFT and end-to-end latency (max_tokens 8) with and without persistence.
    """
    import random

    from pagedllm import LLM, SamplingParams

    rng = random.Random(seed)
    lengths = [rng.randint(*doc_tokens) for _ in range(docs)]
    texts = [[rng.randrange(3, 4000) for _ in range(n)] for n in lengths]
    weights = [1 / (i + 1) ** zipf_a for i in range(docs)]
    order = rng.choices(range(docs), weights, k=requests)
    prompts = [texts[d] + [rng.randrange(3, 4000) for _ in range(16)] for d in order]
    path = checkpoint(dict(checkpoint_preset(preset),
                           max_position_embeddings=max(doc_tokens[1] + 64, 4096)))
    blocks = int(pool_docs * sum(lengths) / docs / bs) + 64
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    out = {}
    for mode in ("memory only", "persistence"):
        store = tempfile.mkdtemp(prefix="pagedllm-kv-") if mode == "persistence" else None
        ttft, e2e = [], []
        try:
            half = len(prompts) // 2
            for phase in (prompts[:half], prompts[half:]):  # a restart between the halves
                kw = dict(block_size=bs, num_kv_blocks=blocks, max_model_len=doc_tokens[1] + 64)
                if store:
                    kw["persistence"] = {"storage_path": store}
                llm = LLM(path, **kw)
                for p in phase:
                    t0 = time.perf_counter()
                    (o,) = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)
                    m = o.metrics
                    ttft.append(m["first_token_time"] - m["arrival_time"])
                    e2e.append(time.perf_counter() - t0)
                if store:
                    llm.engine.shutdown()
        finally:
            if store:
                shutil.rmtree(store, ignore_errors=True)
        q = statistics.quantiles
        out[mode] = {"ttft_p50_s": statistics.median(ttft), "ttft_p99_s": q(ttft, n=100)[98],
                     "e2e_p50_s": statistics.median(e2e), "e2e_p99_s": q(e2e, n=100)[98]}
        print(mode, {k: round(v, 3) for k, v in out[mode].items()}, flush=True)
    mem, per = out["memory only"], out["persistence"]
    out["p99_ttft_change"] = per["ttft_p99_s"] / mem["ttft_p99_s"] - 1
    out["p99_e2e_change"] = per["e2e_p99_s"] / mem["e2e_p99_s"] - 1
    out["setup"] = dict(preset=preset, docs=docs, doc_tokens=doc_tokens, requests=requests,
                        zipf_a=zipf_a, pool_blocks=blocks, block_size=bs)
    return out


def measure_no_reuse(preset: str = "tiny", n: int = 32, prompt_len: int = 512, out_len: int = 32,
                     repeats: int = 3, bs: int = 16) -> dict:
    """The cost of writing every block on a workload that never reuses one: output tokens/s of
    the same fresh prompts with the tier on (hot_blocks_threshold 0) and off, interleaved runs,
    medians."""
    import random

    from pagedllm import LLM, SamplingParams

    path = checkpoint(preset)
    sp = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    rates = {"off": [], "on": []}
    rng = random.Random(1)
    for r in range(repeats):
        for mode in ("off", "on"):
            prompts = [{"prompt_token_ids": [rng.randrange(3, 4000) for _ in range(prompt_len)]}
                       for _ in range(n)]  # never seen before: nothing to reuse
            store = tempfile.mkdtemp(prefix="pagedllm-kv-") if mode == "on" else None
            kw = {"persistence": {"storage_path": store}} if store else {}
            llm = LLM(path, block_size=bs, max_num_seqs=n, **kw)
            llm.generate(prompts[:1], SamplingParams(max_tokens=1), use_tqdm=False)  # warm
            t0 = time.perf_counter()
            outs = llm.generate(prompts[1:], sp, use_tqdm=False)
            rates[mode].append(sum(len(o.outputs[0].token_ids) for o in outs)
                               / (time.perf_counter() - t0))
            if store:
                written = llm.kv_cache_stats()["disk_bytes_written"]
                llm.engine.shutdown()
                shutil.rmtree(store, ignore_errors=True)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    res = {"tok_s_off": off, "tok_s_on": on, "ratio_on_off": on / off,
           "bytes_written_last_run": written, "runs": rates}
    print(f"no reuse: {off:.0f} tok/s without the tier, {on:.0f} with it ({on / off:.3f}x)",
          flush=True)
    return res


def checkpoint_preset(name: str) -> dict:
    from pagedllm.model.checkpoint import PRESETS

    return dict(PRESETS[name])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cfg = PersistenceBenchConfig.quick() if args.quick else PersistenceBenchConfig()
    res = measure(cfg)
    res["trace"] = (measure_trace(docs=4, doc_tokens=(256, 512), requests=8) if args.quick
                    else measure_trace())
    res["no_reuse"] = (measure_no_reuse(n=4, prompt_len=64, out_len=4, repeats=1) if args.quick
                       else measure_no_reuse())
    write_results("persistence", res)


if __name__ == "__main__":
    main()
