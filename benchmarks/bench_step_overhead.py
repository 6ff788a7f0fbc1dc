"""The engine's own time per step: a step's wall time minus its model forward.

A batch of sequences decodes on the "tiny" preset (where the forward is small, so the engine's
Python and the scheduler's crossings into the C++ KV manager show); per step the wall time of
`LLMEngine.step()` and of the model's forward (timed by wrapping the model's `forward`) are
recorded, in wall time and in the main thread's CPU time (time.thread_time: the engine's Python
runs on the main thread, so its CPU time leaves out the time slices other jobs on a shared
machine take). Reported: medians over the decode steps of several runs, for a few batch sizes.
This is the figure the worker-boundary redesign must not make worse (benchmarks/
step_overhead_ab.py runs this script on the engine before and after, alternately).

Usage: python -m benchmarks.bench_step_overhead [--quick] [--label NAME] [--threads N]
Writes benchmarks/results/step_overhead.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import List, Optional

from benchmarks.common import checkpoint, machine_info, write_results


@dataclass
class StepOverheadConfig:
    """What to measure.

    Attributes:
        model: checkpoint preset.
        batch_sizes: sequences decoding together.
        prompt_len: tokens of each prompt.
        steps: decode steps measured per run.
        runs: runs per batch size (medians are over all their steps).
        num_threads: engine threads (None: the engine's default, every core).
    """

    model: str = "tiny"
    batch_sizes: List[int] = field(default_factory=lambda: [1, 16, 64, 256])
    prompt_len: int = 32
    steps: int = 48
    runs: int = 3
    num_threads: Optional[int] = None

    @classmethod
    def quick(cls) -> "StepOverheadConfig":
        return cls(batch_sizes=[1, 16], steps=8, runs=1)


def _find_model(engine):
    """The torch model under the engine, wherever the engine keeps it."""
    for path in ("executor.worker.model_runner.model", "model"):
        obj = engine
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    raise AttributeError("cannot find the engine's model")


def measure(cfg: StepOverheadConfig) -> dict:
    """Runs the measurement. Returns {"rows": [...], "machine": {...}}."""
    from pagedllm import SamplingParams
    from pagedllm.config import EngineConfig
    from pagedllm.engine.llm_engine import LLMEngine

    path = checkpoint(cfg.model)
    rows = []
    for bs in cfg.batch_sizes:
        engine = LLMEngine(EngineConfig(model=path, max_num_seqs=max(bs, 1),
                                        enable_prefix_caching=False, seed=0,
                                        num_threads=cfg.num_threads))
        model = _find_model(engine)
        forward = model.forward
        spent = [0.0, 0.0]  # wall, main-thread CPU

        def timed(*a, **k):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return forward(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0
                spent[1] += time.thread_time() - c0

        model.forward = timed
        step_times, fwd_times, step_cpu, fwd_cpu = [], [], [], []
        for run in range(cfg.runs):
            sp = SamplingParams(max_tokens=cfg.steps + 2, ignore_eos=True, temperature=0.0)
            for i in range(bs):
                engine.add_request(f"{run}-{i}", {"prompt_token_ids": [(7 * i + j) % 4000 + 1
                                                                       for j in range(cfg.prompt_len)]}, sp)
            engine.step()  # prefill
            engine.step()  # first decode (warm)
            for _ in range(cfg.steps):
                spent[0] = spent[1] = 0.0
                t0, c0 = time.perf_counter(), time.thread_time()
                engine.step()
                step_times.append(time.perf_counter() - t0)
                step_cpu.append(time.thread_time() - c0)
                fwd_times.append(spent[0])
                fwd_cpu.append(spent[1])
            while engine.has_unfinished_requests():
                engine.step()
        over = [s - f for s, f in zip(step_times, fwd_times)]
        rows.append({"batch": bs, "step_ms": 1e3 * statistics.median(step_times),
                     "forward_ms": 1e3 * statistics.median(fwd_times),
                     "overhead_ms": 1e3 * statistics.median(over),
                     "overhead_us_per_seq": 1e6 * statistics.median(over) / bs,
                     "overhead_cpu_ms": 1e3 * statistics.median(
                         s - f for s, f in zip(step_cpu, fwd_cpu))})
        print(f"batch {bs:4d}: step {rows[-1]['step_ms']:.3f} ms, forward {rows[-1]['forward_ms']:.3f} ms, "
              f"engine {rows[-1]['overhead_ms']:.3f} ms ({rows[-1]['overhead_us_per_seq']:.1f} us/seq), "
              f"engine CPU {rows[-1]['overhead_cpu_ms']:.3f} ms", flush=True)
    return {"rows": rows, "machine": machine_info(), "config": cfg.__dict__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--label", default="current", help="name of this measurement in the JSON")
    ap.add_argument("--threads", type=int, default=None, help="engine threads (default: all)")
    ap.add_argument("--batch-sizes", default=None, help="comma list (default 1,16,64,256)")
    args = ap.parse_args()
    cfg = StepOverheadConfig.quick() if args.quick else StepOverheadConfig()
    cfg.num_threads = args.threads
    if args.batch_sizes:
        cfg.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    res = measure(cfg)
    res["label"] = args.label
    write_results(f"step_overhead_{args.label}", res)


if __name__ == "__main__":
    main()
