"""Where one decode step of the "small" model goes, and how far it is from its floor.

A batch of `batch` sequences is prefilled (prompt `prompt_len` tokens each), then the engine
runs decode steps only (every sequence one token per step, greedy, forced length):
- `steps` steps timed one by one without any profiler: the step time (median, p10, p90), and
  its main-thread CPU time (with --threads 1 every op runs on that thread, and the profile, the
  bandwidth and the matmul rate below are then timed in that thread's CPU time too, so that
  other jobs on a shared machine count less);
- with the decoder stack (model/decoder_stack.py: every layer's kernels in one `_core` call,
  which a profile cannot split), the same number of steps on the Python layers, unprofiled:
  the same kernels called one by one (`step_ms_python_layers`);
- the same number of steps under cProfile, on the Python layers: the own time of every function per step, in
  buckets (layer projections, lm_head, attention kernel, KV write, RMSNorm, other torch ops,
  sampler, scheduler, runner input prep, the rest of the engine). cProfile slows the Python
  parts, so the buckets sum to more than the unprofiled step; the C buckets are barely touched.
- the floor of each part, the larger of two: the bytes it must read (every weight once, the
  lm_head too; the embedding rows of the batch only; the K/V of every context token once) over
  the read bandwidth measured in the same run (`_core.stream_read_sum` over 1 GiB, median of 5),
  and its multiply-adds over the dense matmul rate measured in the same run (a 2048^3 `torch.mm`
  in the model's dtype, median of 5: what oneDNN reaches on this CPU when nothing starves it).
  On a 2-core CPU a 16-row fp32 decode step is compute-bound, not bandwidth-bound.

Prints a markdown table and writes benchmarks/results/decode_step.json.

Usage: PYTHONPATH=.:python python -m benchmarks.decode_step [--model small] [--batch 16]
       [--prompt-len 128] [--steps 24] [--dtype float32|bfloat16] [--threads N]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Dict, List

import torch

from benchmarks.common import checkpoint, machine_info, write_results
from benchmarks.engines import PagedEngine

# (bucket, predicate on (file, function name)), first match wins; "lm_head" is split out of
# the projections afterwards from compute_logits' cumulative time.
BUCKETS = (
    ("projections (GEMM)", lambda f, n: "_linear_pointwise" in n or "_nn.linear" in n
     or n.endswith("method matmul>") or n.endswith("_core.linear>")),
    ("attention kernel", lambda f, n: "paged_attention" in n),
    ("KV cache write", lambda f, n: "reshape_and_cache" in n),
    ("RMSNorm kernel", lambda f, n: "rms_norm" in n),
    ("sampler", lambda f, n: "sampler.py" in f),
    ("scheduler + KV manager", lambda f, n: "scheduler.py" in f or "KVCacheManager" in n
     or "append_batch" in n or "block_tables" in n),
    ("runner input prep", lambda f, n: "model_runner.py" in f or "attention.py" in f),
    ("other torch ops (RoPE, SiLU*up, adds, embedding)",
     lambda f, n: "torch" in n or "torch" in f or "Tensor" in n),
    ("engine, outputs, Python rest", lambda f, n: True),
)
LM_HEAD = "lm_head (in projections)"


def read_bandwidth(gib: float = 1.0, rounds: int = 5, clock=time.perf_counter) -> float:
    """Bytes per second `_core.stream_read_sum` reads from a `gib` GiB buffer (median;
    `clock`: time.thread_time when the kernel pool has one thread, so other jobs count less)."""
    from pagedllm import _core

    buf = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    _core.stream_read_sum(buf)
    times = []
    for _ in range(rounds):
        t0 = clock()
        _core.stream_read_sum(buf)
        times.append(clock() - t0)
    return buf.numel() * 4 / statistics.median(times)


def matmul_rate(dtype: torch.dtype, n: int = 2048, rounds: int = 5,
                clock=time.perf_counter) -> float:
    """Multiply-add FLOP/s (2 per multiply-add) of an n x n x n torch.mm in `dtype` (median;
    `clock` as for read_bandwidth)."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    times = []
    for _ in range(rounds):
        t0 = clock()
        torch.mm(a, b)
        times.append(clock() - t0)
    return 2 * n ** 3 / statistics.median(times)


def floor_bytes(cfg, batch: int, context: int, weight_bytes: int, kv_bytes: int) -> Dict[str, int]:
    """Bytes one decode step of `batch` sequences at `context` tokens must read.

    Args:
        cfg: the ModelConfig.
        weight_bytes, kv_bytes: bytes per weight element and per stored K/V element.
    Returns:
        {"weights": layer + final-norm weights, "lm_head": its matrix, "kv": K and V read}.
    """
    h = cfg.hidden_size
    embedding = cfg.vocab_size * h
    layers = cfg.num_parameters() - embedding - (0 if cfg.tie_word_embeddings else embedding)
    kv = batch * context * cfg.num_hidden_layers * 2 * cfg.kv_size * kv_bytes
    return {"weights": layers * weight_bytes, "lm_head": embedding * weight_bytes, "kv": kv}


def _prefill(eng, batch: int, prompt_len: int, max_tokens: int, vocab: int) -> List[str]:
    from pagedllm import SamplingParams

    g = torch.Generator().manual_seed(0)
    ids = []
    for i in range(batch):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        rid = f"decode-{i}"
        eng.add_request(rid, {"prompt_token_ids": prompt},
                        SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens,
                                       ignore_eos=True, temperature=0.0))
        ids.append(rid)
    # step until every sequence has its first token: from then on every step is decode-only
    while any(r.first_token_time is None for r in eng.requests.values()):
        eng.step()
    return ids


def _profiled(eng, steps: int, clock=None) -> Dict[str, float]:
    prof = cProfile.Profile(clock) if clock is not None else cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        eng.step()
    prof.disable()
    stats = pstats.Stats(prof)
    out = {name: 0.0 for name, _ in BUCKETS}
    lm_head = 0.0
    for (file, _, name), (_, _, own, cum, _) in stats.stats.items():
        bucket = next(b for b, match in BUCKETS if match(file, name))
        out[bucket] += own
        if name == "compute_logits" and file.endswith("llama.py"):
            lm_head += cum
    proj = next(iter(out))
    lm_head = min(lm_head, out[proj])
    out[proj] -= lm_head
    out = {LM_HEAD: lm_head, **out}
    return {k: 1e3 * v / steps for k, v in out.items()}  # ms per step


def _llama(eng):
    """The engine's model (in-process executor), or None."""
    runner = getattr(getattr(getattr(eng, "executor", None), "worker", None), "model_runner", None)
    return getattr(runner, "model", None)


def _timed_steps(eng, steps: int) -> tuple:
    """Wall and main-thread CPU seconds of each of `steps` engine steps."""
    times, cpu_times = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        eng.step()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.thread_time() - c0)
    return times, cpu_times


def run(model: str = "small", batch: int = 16, prompt_len: int = 128, steps: int = 24,
        dtype: str = "float32", threads=None) -> dict:
    """Measures the decode step; returns (and writes) the figures.

    threads: torch and kernel threads (None: every core). With 1, every op runs on the main
    thread, so its CPU time per step (`step_cpu_ms`) leaves out what other jobs take.
    """
    from pagedllm.model.checkpoint import random_config

    cfg = random_config(model)
    engine = PagedEngine(checkpoint(model), dtype=dtype, num_threads=threads)
    eng = engine.llm.engine
    _prefill(eng, batch, prompt_len, 3 * steps + 8, cfg.vocab_size)
    eng.step()  # one warm decode step
    times, cpu_times = _timed_steps(eng, steps)
    # The profile splits the step into its kernels only on the Python layers (the decoder
    # stack runs them all in one call): the same kernels, called one by one.
    llama = _llama(eng)
    stack = getattr(llama, "_stack", None) if llama is not None else None
    stack = stack if stack not in (None, False) else None
    python_times = None
    if stack is not None:
        llama._stack = None
        python_times, _ = _timed_steps(eng, steps)
    # mean context over the profiled steps, roughly (after the Python-layer steps, if any)
    context = prompt_len + 2 + steps * (2 if python_times else 1)
    try:
        # one thread: profile in its CPU time too, so the buckets leave out what other jobs take
        profiled = _profiled(eng, steps, time.thread_time if threads == 1 else None)
    finally:
        if stack is not None:
            llama._stack = stack
    eng.abort_request(list(eng.requests))
    clock = time.thread_time if threads == 1 else time.perf_counter
    bw = read_bandwidth(clock=clock)
    rate = matmul_rate(torch.bfloat16 if dtype == "bfloat16" else torch.float32, clock=clock)
    elem = 2 if dtype == "bfloat16" else 4
    need = floor_bytes(cfg, batch, context, elem, elem)
    flops = {k: 2 * batch * v // elem for k, v in need.items() if k != "kv"}
    # attention: q.k and p.v, 2 multiply-adds per head dim per context token per query head
    flops["kv"] = 4 * batch * context * cfg.num_hidden_layers * cfg.q_size
    floor_ms = {k: 1e3 * max(v / bw, flops[k] / rate) for k, v in need.items()}
    q = statistics.quantiles(times, n=10)
    out = {"benchmark": "decode_step", "model": model, "dtype": dtype, "batch": batch,
           "prompt_len": prompt_len, "steps": steps, "context_tokens": context,
           "threads": threads,
           "step_ms": {"median": round(1e3 * statistics.median(times), 2),
                       "p10": round(1e3 * q[0], 2), "p90": round(1e3 * q[-1], 2)},
           "step_cpu_ms": round(1e3 * statistics.median(cpu_times), 2),
           "decoder_stack": stack is not None,
           "step_ms_python_layers": (round(1e3 * statistics.median(python_times), 2)
                                     if python_times else None),
           "profiled_ms_per_step": {k: round(v, 3) for k, v in profiled.items()},
           "read_bandwidth_gb_s": round(bw / 1e9, 2),
           "matmul_gflop_s": round(rate / 1e9, 1),
           "floor_bytes": need, "floor_flops": flops,
           "floor_bound": {k: "compute" if flops[k] / rate > need[k] / bw else "bandwidth"
                           for k in need}, "floor_ms": {k: round(v, 2) for k, v in floor_ms.items()},
           "floor_ms_total": round(sum(floor_ms.values()), 2),
           "machine": machine_info()}
    write_results("decode_step", out)
    return out


def markdown(r: dict) -> str:
    """The figures as a markdown table (ms per decode step)."""
    p = r["profiled_ms_per_step"]
    total = sum(p.values())
    f = r["floor_ms"]
    b = r["floor_bound"]
    floor_of = {LM_HEAD: f"{f['lm_head']:.2f} ({b['lm_head']})",
                "projections (GEMM)": f"{f['weights']:.2f} ({b['weights']})",
                "attention kernel": f"{f['kv']:.2f} ({b['kv']})"}
    rows = [f"| {k} | {v:.2f} | {100 * v / total:.0f}% | "
            f"{floor_of[k]} |" if k in floor_of else
            f"| {k} | {v:.2f} | {100 * v / total:.0f}% | - |" for k, v in p.items()]
    s = r["step_ms"]
    return "\n".join([
        f"\"{r['model']}\" {r['dtype']}, {r['batch']} sequences at ~{r['context_tokens']} tokens "
        f"of context, {r['steps']} decode steps; read bandwidth {r['read_bandwidth_gb_s']} GB/s, "
        f"dense matmul {r['matmul_gflop_s']} GFLOP/s",
        "", "| where | ms per step (cProfile own time, Python layers) | share | floor (bound) |",
        "| --- | ---: | ---: | ---: |", *rows,
        f"| **profiled step** | {total:.2f} | | **{r['floor_ms_total']:.2f}** |",
        f"| **step without the profiler** | {s['median']:.2f} (p10 {s['p10']:.2f}, "
        f"p90 {s['p90']:.2f}) | | |",
        f"| **main-thread CPU time per step** | {r.get('step_cpu_ms', float('nan')):.2f} | | |",
        *([f"| **step without the profiler, Python layers** (the decoder stack off; the "
           f"profile's path) | {r['step_ms_python_layers']:.2f} | | |"]
          if r.get("step_ms_python_layers") is not None else [])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=None, help="torch / kernel threads")
    a = ap.parse_args()
    print(markdown(run(a.model, a.batch, a.prompt_len, a.steps, a.dtype, a.threads)))


if __name__ == "__main__":
    main()
