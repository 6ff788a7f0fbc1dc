"""KV-cache storage dtypes (fp16, bf16, fp8) against fp32 storage: greedy agreement, logprob error.

For each model, a batch of 16 prompts of different lengths (1..129 tokens) is run with fp32 KV
storage for 64 greedy decode steps (plus the prefill token). Then, for each storage dtype:
  * free run: the dtype's own greedy tokens; reported: position-wise agreement with the fp32
    tokens, sequences identical to the end, mean length of the identical prefix;
  * teacher-forced run on the fp32 tokens, so positions line up; reported: the largest
    |logprob_dtype - logprob_fp32| of the fp32 greedy token and over the whole vocabulary.
fp8 uses k_scale = v_scale = 1 (values far inside e4m3's +-448).

Models: the "tiny" and "small" presets as written (initializer_range 0.02: nearly uniform
attention, a gentle test of KV precision) and "tiny" with initializer_range 0.1 (peaked
attention, logits O(5): where KV rounding matters most).

Usage:  PYTHONPATH=python python benchmarks/bench_kv_dtypes.py [--models tiny,tiny_peaked,small]
Writes benchmarks/results/kv_dtypes.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# The engine-like test runner (tests/python/model_fixtures.py) drives the model here too.
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

from model_fixtures import PARITY_PROMPT_LENGTHS, PagedRunner, blocks_needed, make_prompts  # noqa: E402
from pagedllm.model import load_model, write_random_checkpoint  # noqa: E402

MODELS = {
    "tiny": ("tiny", {}),
    "tiny_peaked": ("tiny", {"initializer_range": 0.1}),
    "small": ("small", {}),
}
DTYPES = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
MAX_NEW_TOKENS = 65
BLOCK_SIZE = 16


def run(model, config, prompts, kv_dtype, forced=None):
    runner = PagedRunner(model, config, BLOCK_SIZE,
                         blocks_needed(prompts, MAX_NEW_TOKENS, BLOCK_SIZE), kv_cache_dtype=kv_dtype)
    return runner.generate(prompts, MAX_NEW_TOKENS, forced=forced)


def measure(name: str, preset: str, overrides: dict) -> dict:
    with tempfile.TemporaryDirectory() as d:
        write_random_checkpoint(d, preset, seed=0, **overrides)
        model, config = load_model(d)
    prompts = make_prompts(config.vocab_size, PARITY_PROMPT_LENGTHS, seed=1)
    base = run(model, config, prompts, "auto")
    gen_rows = [lg[len(p) - 1:] for p, lg in zip(prompts, base.logits)]  # [65, vocab] each
    base_lp = [torch.log_softmax(r, -1) for r in gen_rows]
    # how decisive the fp32 greedy choices are: gap between the top two logprobs
    top2 = torch.cat([lp.topk(2, dim=-1).values for lp in base_lp])
    gaps = (top2[:, 0] - top2[:, 1]).sort().values
    out = {"model": name, "preset": preset, "overrides": overrides,
           "num_parameters": config.num_parameters(),
           "fp32_top2_gap_median": float(f"{float(gaps[len(gaps) // 2]):.3g}"),
           "fp32_top2_gap_p10": float(f"{float(gaps[len(gaps) // 10]):.3g}"), "dtypes": {}}
    print(f"{name:12s} fp32 top-2 logprob gap: median {out['fp32_top2_gap_median']}, "
          f"10th percentile {out['fp32_top2_gap_p10']}", flush=True)
    for dt in DTYPES:
        free = run(model, config, prompts, dt)
        same = [sum(a == b for a, b in zip(x, y)) for x, y in zip(free.tokens, base.tokens)]
        prefix = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                  for x, y in zip(free.tokens, base.tokens)]
        forced = run(model, config, prompts, dt, forced=base.tokens)
        tok_err, vocab_err = 0.0, 0.0
        for p, lg, ref_lp, toks in zip(prompts, forced.logits, base_lp, base.tokens):
            lp = torch.log_softmax(lg[len(p) - 1:], -1)
            diff = (lp - ref_lp).abs()
            vocab_err = max(vocab_err, float(diff.max()))
            tok_err = max(tok_err, float(diff.gather(1, torch.tensor(toks)[:, None]).max()))
        total = sum(len(t) for t in base.tokens)
        out["dtypes"][dt] = {
            "token_agreement": round(sum(same) / total, 4),
            "sequences_identical": f"{sum(p == MAX_NEW_TOKENS for p in prefix)}/{len(prompts)}",
            "mean_identical_prefix": round(sum(prefix) / len(prefix), 1),
            "max_logprob_err_greedy_token": float(f"{tok_err:.3g}"),
            "max_logprob_err_vocab": float(f"{vocab_err:.3g}"),
        }
        print(f"{name:12s} {dt:9s} agreement {sum(same) / total:6.1%}  identical "
              f"{out['dtypes'][dt]['sequences_identical']:>5s}  prefix "
              f"{sum(prefix) / len(prefix):5.1f}  max|dlogprob| token {tok_err:.2e} vocab {vocab_err:.2e}",
              flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "kv_dtypes.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    results = [measure(m, *MODELS[m]) for m in args.models.split(",")]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "kv_dtypes", "date": time.strftime("%Y-%m-%d"),
                   "machine": platform.processor() or platform.machine(),
                   "torch_threads": torch.get_num_threads(), "block_size": BLOCK_SIZE,
                   "decode_steps": MAX_NEW_TOKENS - 1, "prompts": list(PARITY_PROMPT_LENGTHS),
                   "results": results}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
