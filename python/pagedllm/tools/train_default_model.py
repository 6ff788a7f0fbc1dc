"""Trains the default model that ships inside the package (``pagedllm/default_model``).

One command reproduces it (from the repository root, about 40 minutes on 2 CPU cores)::

    nice -n 10 python -m pagedllm.tools.train_default_model --out python/pagedllm/default_model

Data: the Python documentation every CPython carries (``stdlib_corpus``), split by document into
train and validation. Tokenizer: byte-level BPE trained on the train split. Model: a small
``LlamaForCausalLM`` trained from scratch with AdamW, linear warmup and cosine decay, in
float32, then stored as bfloat16. The run writes the model files and ``TRAINING.md`` (command,
data fingerprint, losses, samples) into ``--out``.

Needs torch, tokenizers, safetensors and transformers (a dev dependency; pagedllm itself never
imports transformers at run time).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The model shape. head_dim 32 and 8 query heads over 4 KV heads (GQA) exercise the kernels.
MODEL_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
}
EVAL_CHUNKS = 48  # windows of each split scored at every evaluation
SAMPLE_PROMPTS = ("The list type", "A dictionary", "The for statement")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m pagedllm.tools.train_default_model", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default="default_model_out", help="output directory (default: %(default)s)")
    p.add_argument("--steps", type=int, default=800, help="optimizer steps (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1234, help="seed of weights, batches, samples (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=50, help="linear warmup steps (default: %(default)s)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decay on matrices (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary (default: %(default)s)")
    # One thread: on a shared 2-core machine a niced 2-thread run stalls at every OpenMP barrier
    # while the other core serves someone else (measured 2.6x slower per step than 1 thread).
    p.add_argument("--threads", type=int, default=1, help="torch threads while training (default: %(default)s)")
    p.add_argument("--eval-every", type=int, default=100, help="steps between evaluations (default: %(default)s)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.seq_len < 2 or args.threads < 1 or args.eval_every < 1:
        p.error("--steps, --batch-size, --threads and --eval-every must be >= 1 and --seq-len >= 2")
    if args.seq_len > MODEL_SHAPE["max_position_embeddings"]:
        p.error(f"--seq-len must be <= {MODEL_SHAPE['max_position_embeddings']} (max_position_embeddings)")
    return args


def encode_documents(tokenizer, docs) -> torch.Tensor:
    """Returns one stream of ids: ``<|bos|> doc <|eos|>`` for each document, in order. Shape: [n]."""
    import torch

    from pagedllm.tools.default_model_tokenizer import EOS_TOKEN

    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    ids: list[int] = []
    for enc in tokenizer.encode_batch([d.text for d in docs]):  # encode() prepends <|bos|>
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warmup to ``args.lr``, then cosine decay to a tenth of it at the last step."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def fixed_chunks(stream, seq_len: int, max_chunks: int):
    """Evenly spaced windows of seq_len + 1 tokens. Returns [num_chunks, seq_len + 1]."""
    import torch

    n = (stream.numel() - 1) // seq_len
    picks = torch.linspace(0, n - 1, steps=min(n, max_chunks)).round().long().tolist()
    return torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in picks])


def train(model, train_ids, eval_sets: dict, args: argparse.Namespace, log) -> list[dict]:
    """Runs the optimizer loop; returns the evaluation history (one dict per evaluation)."""
    import torch
    import torch.nn.functional as F

    from pagedllm.tools.default_model_report import mean_loss

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    gen = torch.Generator().manual_seed(args.seed)
    history, t0, recent = [], time.time(), []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        starts = torch.randint(0, train_ids.numel() - args.seq_len - 1, (args.batch_size,), generator=gen)
        batch = torch.stack([train_ids[s : s + args.seq_len + 1] for s in starts.tolist()])
        logits = model(input_ids=batch[:, :-1]).logits  # [batch, seq_len, vocab]
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            row = {"step": step + 1, "batch_loss": sum(recent) / len(recent), "minutes": (time.time() - t0) / 60}
            row.update({name: mean_loss(model, chunks, args.batch_size) for name, chunks in eval_sets.items()})
            history.append(row)
            recent = []
            log(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return history


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        sys.exit(f"train_default_model needs torch and transformers (pip install 'transformers>=4.45'): {e}")
    from pagedllm.tools import stdlib_corpus
    from pagedllm.tools.default_model_export import export_hf_layout, llama_config
    from pagedllm.tools.default_model_report import evaluate_export, write_report
    from pagedllm.tools.default_model_tokenizer import SPECIAL_TOKENS, train_tokenizer

    def log(msg: str) -> None:
        print(f"[train_default_model] {msg}", flush=True)

    wall_start = time.time()
    docs = stdlib_corpus.pydoc_topics() + stdlib_corpus.stdlib_docstrings()
    train_docs = [d for d in docs if not stdlib_corpus.is_validation(d)]
    val_docs = [d for d in docs if stdlib_corpus.is_validation(d)]
    data = {
        "sha256": stdlib_corpus.corpus_sha256(docs),
        "documents": len(docs), "train_documents": len(train_docs), "val_documents": len(val_docs),
        "train_chars": sum(len(d.text) for d in train_docs), "val_chars": sum(len(d.text) for d in val_docs),
    }
    log(f"corpus: {data}")

    tokenizer = train_tokenizer((d.text for d in train_docs), args.vocab_size)
    train_ids, val_ids = encode_documents(tokenizer, train_docs), encode_documents(tokenizer, val_docs)
    data.update(train_tokens=train_ids.numel(), val_tokens=val_ids.numel(), vocab_size=tokenizer.get_vocab_size())
    log(f"tokens: train={train_ids.numel()} val={val_ids.numel()}")

    special_ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    config = llama_config(vocab_size=tokenizer.get_vocab_size(), special_ids=special_ids, **MODEL_SHAPE)
    torch.manual_seed(args.seed)
    hf_config = LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    model = LlamaForCausalLM(hf_config).float()
    num_params = sum(p.numel() for p in model.parameters())
    log(f"model: {num_params} parameters")

    eval_sets = {
        "train_loss": fixed_chunks(train_ids, args.seq_len, EVAL_CHUNKS),
        "val_loss": fixed_chunks(val_ids, args.seq_len, EVAL_CHUNKS),
    }
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    train_start = time.time()
    try:
        history = train(model, train_ids, eval_sets, args, log)
    finally:
        torch.set_num_threads(previous_threads)
    train_minutes = (time.time() - train_start) / 60

    export_hf_layout(args.out, model, config, tokenizer)
    exported = evaluate_export(args.out, eval_sets, args, SAMPLE_PROMPTS)
    log(f"exported (bf16) losses: {exported['losses']}")
    write_report(
        args.out, args=args, argv=sys.argv[1:] if argv is None else argv, data=data, num_params=num_params,
        history=history, exported=exported, train_minutes=train_minutes,
        wall_minutes=(time.time() - wall_start) / 60,
    )
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
