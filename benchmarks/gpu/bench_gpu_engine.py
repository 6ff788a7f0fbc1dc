"""GPU engine throughput: pagedllm on CUDA (bf16) beside transformers' generate, same model.

Random-weight checkpoints of the "small" preset (156M) and of a 1B-class shape (hidden 2048,
16 layers, 32/8 heads, ffn 5632, vocab 32000). For each: N requests of P prompt tokens and G
greedy output tokens, all added at once to `LLM(device="cuda", dtype="bfloat16")`; then
transformers' `generate` on the same checkpoint in bf16 with the same batch (padded, static
batch). Output tokens per second, medians of `--repeats` runs after a warm-up.

Usage: python benchmarks/gpu/bench_gpu_engine.py --out OUT.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import checkpoint, machine_info  # noqa: E402

ONE_B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 5632, "vocab_size": 32000,
         "max_position_embeddings": 4096}


def _prompts(n: int, length: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def run_pagedllm(path: str, prompts, gen: int, repeats: int) -> float:
    from pagedllm import LLM, SamplingParams

    llm = LLM(path, device="cuda", dtype="bfloat16", max_num_seqs=len(prompts))
    sp = SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(batch[:4], sp, use_tqdm=False)  # warm-up
    rates = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = llm.generate(batch, sp, use_tqdm=False)
        torch.cuda.synchronize()
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0))
    del llm
    torch.cuda.empty_cache()
    return statistics.median(rates)


def run_transformers(path: str, prompts, gen: int, repeats: int) -> float:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda().eval()
    ids = torch.tensor(prompts, device="cuda")
    kw = dict(max_new_tokens=gen, min_new_tokens=gen, do_sample=False, pad_token_id=0,
              eos_token_id=None)
    with torch.inference_mode():
        model.generate(ids[:4], attention_mask=torch.ones_like(ids[:4]), **kw)
        rates = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            torch.cuda.synchronize()
            rates.append((out.shape[1] - ids.shape[1]) * ids.shape[0] / (time.perf_counter() - t0))
    del model
    torch.cuda.empty_cache()
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, plen, gen, repeats = (16, 128, 32, 1) if args.quick else (64, 256, 128, 3)
    rows = []
    for name, preset in (("small", "small"), ("1b", ONE_B)):
        path = checkpoint(preset)
        prompts = _prompts(n, plen, 32000)
        row = {"model": name, "requests": n, "prompt": plen, "output": gen}
        row["pagedllm_tok_s"] = run_pagedllm(path, prompts, gen, repeats)
        try:
            row["transformers_tok_s"] = run_transformers(path, prompts, gen, repeats)
            row["ratio"] = row["pagedllm_tok_s"] / row["transformers_tok_s"]
        except Exception as e:  # transformers missing or failing: report pagedllm alone
            row["transformers_error"] = repr(e)
        print(json.dumps(row), flush=True)
        rows.append(row)
    info = machine_info()
    info["gpu"] = torch.cuda.get_device_name()
    Path(args.out).write_text(json.dumps({"machine": info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
