"""vLLM's CPU build as a long-lived worker; run by the vLLM venv's python (setup_vllm.sh).

Usage: <vllm-venv>/bin/python benchmarks/peers/vllm_runner.py MODEL_DIR [--block-size 32]
       [--max-num-seqs 256] [--kv-space-gib 2] [--enable-prefix-caching]
       [--dtype float32|bfloat16]

It starts one vllm.LLM (55-100 s: torch.compile) and then serves commands, one JSON object per
line on stdin, so that a benchmark can interleave vLLM's runs with other engines' without paying
the start-up again:

    {"op": "generate", "requests": [{"prompt_token_ids": [...], "max_tokens": n}, ...],
     "n": 1, "temperature": 0.0, "seed": null, "keep": 8}
    {"op": "reset_prefix_cache"}
    {"op": "quit"}

Each reply is one line on stdout starting with worker_protocol.MARKER followed by JSON (vLLM logs to stdout
too; the client skips every other line). The first reply, {"event": "ready", ...}, is sent once
the engine has started. A generate reply holds elapsed_s (the generate call only), the output
token count and the first `keep` tokens of each request.

Fairness (see docs/BENCHMARKS.md): the same dtype as pagedllm (fp32 unless asked), token-id prompts, greedy, outputs forced
to their length (min_tokens = max_tokens, ignore_eos), prefix caching off unless asked for,
threads bound to both cores.
"""

import os
import sys
import time

from worker_protocol import reply, serve  # beside this script (run as a file)
from vllm_isa import hold_to_emulated_isa, kernel_libraries

hold_to_emulated_isa()  # at module level: the spawned engine core runs it too


def generate(llm, cmd):
    from vllm import SamplingParams

    reqs = cmd["requests"]
    n = cmd.get("n", 1)
    temperature = cmd.get("temperature", 0.0)
    seed = cmd.get("seed")
    keep = cmd.get("keep", 8)
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in reqs]
    params = [SamplingParams(n=n, temperature=temperature, max_tokens=r["max_tokens"],
                             min_tokens=r["max_tokens"], ignore_eos=True, detokenize=False,
                             seed=None if seed is None else seed + i)
              for i, r in enumerate(reqs)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    ttft = []
    for o in outs:
        m = getattr(o, "metrics", None)
        lat = getattr(m, "first_token_latency", None) if m is not None else None
        if lat:
            ttft.append(lat)
    return {"event": "result", "elapsed_s": elapsed,
            "output_tokens": sum(len(c.token_ids) for o in outs for c in o.outputs),
            "first_tokens": [list(o.outputs[0].token_ids[:keep]) for o in outs],
            "ttft_s": ttft or None}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--kv-space-gib", type=int, default=2)
    ap.add_argument("--enable-prefix-caching", action="store_true")
    ap.add_argument("--threads-bind", default="0-1")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_space_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", args.threads_bind)
    os.environ.setdefault("VLLM_CACHE_ROOT", "/tmp/pagedllm-vllm-cache")
    import vllm
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, block_size=args.block_size,
              skip_tokenizer_init=True, enable_prefix_caching=args.enable_prefix_caching,
              max_num_seqs=args.max_num_seqs, seed=0)
    startup = time.perf_counter() - t0
    sched = llm.llm_engine.vllm_config.scheduler_config
    reply({"event": "ready", "startup_s": startup, "version": vllm.__version__,
           "block_size": args.block_size, "max_num_seqs": sched.max_num_seqs,
           "max_num_batched_tokens": sched.max_num_batched_tokens,
           "enable_prefix_caching": args.enable_prefix_caching,
           "kv_space_gib": int(os.environ["VLLM_CPU_KVCACHE_SPACE"]),
           "threads_bind": os.environ["VLLM_CPU_OMP_THREADS_BIND"], "dtype": args.dtype,
           "kernel_libraries": kernel_libraries(os.getpid())})

    def reset_prefix_cache(cmd: dict) -> None:
        llm.reset_prefix_cache()

    serve({"generate": lambda cmd: generate(llm, cmd), "reset_prefix_cache": reset_prefix_cache})


if __name__ == "__main__":
    sys.exit(main())
