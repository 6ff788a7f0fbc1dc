"""Checks an exported default model with transformers and writes its ``TRAINING.md``.

The checks load the files just written (bfloat16 weights, read back as float32), so the losses
and samples in the report are those of the model that ships, not of the in-memory float32 one.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys


# How each sample continuation is drawn (transformers generate() arguments).
SAMPLING = {"greedy": {"do_sample": False}, "top_p": {"do_sample": True, "temperature": 0.8, "top_p": 0.95}}



def mean_loss(model, chunks, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats/token) of ``model`` over chunks [num_chunks, seq_len + 1]."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, chunks.shape[0], batch_size):
            batch = chunks[i : i + batch_size]
            logits = model(input_ids=batch[:, :-1]).logits  # [b, seq_len, vocab]
            loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten(), reduction="sum")
            total += loss.item()
            count += batch[:, 1:].numel()
    model.train()
    return total / count

def evaluate_export(out_dir: str, eval_sets: dict, args: argparse.Namespace, prompts) -> dict:
    """Loads ``out_dir`` with transformers; returns its losses and sample continuations.

    Args:
        out_dir: a directory written by ``export_hf_layout``.
        eval_sets: name -> token chunks [num_chunks, seq_len + 1], as used during training.
        args: the training arguments (seed, threads, batch size).
        prompts: the prompts to continue.
    Returns:
        ``{"losses": {name: nats/token}, "samples": [{"prompt", "greedy", "top_p"}]}``.
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM


    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        model = LlamaForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
        tokenizer = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
        losses = {name: mean_loss(model, chunks, args.batch_size) for name, chunks in eval_sets.items()}
        samples = []
        for prompt in prompts:
            input_ids = torch.tensor([tokenizer.encode(prompt).ids])  # [1, prompt_len], <|bos|> first
            row = {"prompt": prompt}
            for name, kwargs in SAMPLING.items():
                torch.manual_seed(args.seed)
                with torch.no_grad():
                    out = model.generate(input_ids, max_new_tokens=48, **kwargs)  # [1, prompt_len + new]
                row[name] = tokenizer.decode(out[0, input_ids.shape[1] :].tolist(), skip_special_tokens=True)
            samples.append(row)
    finally:
        torch.set_num_threads(previous_threads)
    return {"losses": losses, "samples": samples}


def _versions() -> str:
    import safetensors
    import tokenizers
    import torch
    import transformers

    return (
        f"Python {platform.python_version()}, torch {torch.__version__}, tokenizers {tokenizers.__version__}, "
        f"transformers {transformers.__version__}, safetensors {safetensors.__version__}, {platform.machine()}"
    )


def _quote(text: str) -> str:
    return "> " + text.strip().replace("\n", "\n> ")


def write_report(out_dir: str, *, args, argv, data, num_params, history, exported, train_minutes, wall_minutes) -> str:
    """Writes ``TRAINING.md`` into ``out_dir`` and returns its path. All arguments are plain values."""
    sizes = {
        name: os.path.getsize(os.path.join(out_dir, name))
        for name in sorted(os.listdir(out_dir))
        if name.endswith((".json", ".safetensors"))
    }
    final = history[-1]
    lines = [
        "# The default model: how it was trained",
        "",
        "Written by `pagedllm.tools.train_default_model` at the end of the run that produced these files.",
        "",
        "## Command",
        "",
        "From the repository root (drop `PYTHONPATH=python` where pagedllm is installed):",
        "",
        "```",
        "PYTHONPATH=python nice -n 10 python -m pagedllm.tools.train_default_model " + " ".join(argv),
        "```",
        "",
        f"Seed {args.seed}; {args.steps} steps of {args.batch_size} x {args.seq_len} tokens; AdamW "
        f"(betas 0.9/0.95, weight decay {args.weight_decay} on matrices), peak lr {args.lr}, "
        f"{args.warmup} warmup steps, cosine decay to lr/10, gradient clipping at 1.0; float32 "
        f"training (torch threads: {args.threads}), weights stored as bfloat16.",
        "",
        f"Environment: {_versions()}.",
        f"Training took {train_minutes:.1f} min; the whole run (data, tokenizer, training, export, "
        f"checks) {wall_minutes:.1f} min of wall time.",
        "",
        "## Data",
        "",
        "`pydoc_data.topics` plus the docstrings of the standard library's public modules "
        f"(see `pagedllm/tools/stdlib_corpus.py`), from Python {platform.python_version()}: "
        f"{data['documents']} documents, corpus SHA-256 `{data['sha256']}`. Validation holds "
        f"{data['val_documents']} documents chosen by a hash of their title: "
        f"{data['val_chars']} characters, {data['val_tokens']} tokens; training holds the other "
        f"{data['train_documents']}: {data['train_chars']} characters, {data['train_tokens']} tokens. "
        "The text depends on the Python minor version and on which optional extension modules "
        "the interpreter has; compare the SHA-256 above.",
        "",
        "## Model",
        "",
        f"LlamaForCausalLM, {num_params} parameters, byte-level BPE vocabulary of "
        f"{data.get('vocab_size', 'see config.json')} tokens trained on the training split. Files:",
        "",
        *[f"- `{name}`: {size} bytes" for name, size in sizes.items()],
        "",
        "## Losses (nats per token)",
        "",
        "Evaluated on up to 48 fixed windows of each split (the same windows at every evaluation);",
        "`batch` is the mean training-batch loss since the previous evaluation.",
        "",
        "| step | minutes | batch | train | validation |",
        "|---:|---:|---:|---:|---:|",
        *[
            f"| {h['step']} | {h['minutes']:.1f} | {h['batch_loss']:.3f} "
            f"| {h['train_loss']:.3f} | {h['val_loss']:.3f} |"
            for h in history
        ],
        "",
        f"Final (float32, in memory): train {final['train_loss']:.3f}, validation {final['val_loss']:.3f}.",
        f"Shipped (bfloat16 files read back by transformers): train {exported['losses']['train_loss']:.3f}, "
        f"validation {exported['losses']['val_loss']:.3f}.",
        "",
        "## Sample continuations (48 new tokens, by transformers from the shipped files)",
        "",
        f"Greedy, and top-p sampling (temperature 0.8, top_p 0.95, `torch.manual_seed({args.seed})`).",
        "",
    ]
    for row in exported["samples"]:
        lines += [f"**{row['prompt']}** (greedy)", "", _quote(row["prompt"] + row["greedy"]), ""]
        lines += [f"**{row['prompt']}** (top-p)", "", _quote(row["prompt"] + row["top_p"]), ""]
    lines += [
        "## Reproducibility",
        "",
        "The data, the tokenizer and the batch order are deterministic. The weights are bitwise",
        "reproducible for the same Python minor version, torch version, CPU instruction set and",
        "`--threads`; other combinations give a model of the same quality with different bits.",
        "",
    ]
    path = os.path.join(out_dir, "TRAINING.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"[train_default_model] report: {path}", file=sys.stderr)
    return path
