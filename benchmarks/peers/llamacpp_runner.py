"""llama.cpp (through llama-cpp-python's C API) as a long-lived worker; run by the venv's python
of setup_llamacpp.sh. Same line protocol as vllm_runner.py (see worker_client.py).

Usage: <llamacpp-venv>/bin/python benchmarks/peers/llamacpp_runner.py MODEL_DIR
       [--max-seqs 64] [--seq-tokens 2048] [--threads 2] [--kv-unified]

The Hugging Face checkpoint is first written as an fp32 GGUF file (cached beside the
checkpoint directory, as <dir>-f32.gguf), with the q/k projection rows reordered for llama.cpp's interleaved RoPE and no
tokenizer ("no_vocab": prompts are token ids). Requests then run with continuous batching: up
to --max-seqs sequences at a time in a KV cache of --max-seqs x --seq-tokens slots (one
buffer with --kv-unified, else --seq-tokens per sequence), each step one llama_decode of every running sequence's next token plus
prompt tokens of newly admitted ones (up to n_batch = 2048 tokens in all), greedy argmax over
the logits of each sequence's last token.
KV cache in fp32 and flash attention off, so that the numerics match the other engines'.
"""

import json
import os
import sys
import time

from worker_protocol import reply, serve  # beside this script (run as a file)


def write_gguf(model_dir: str, path: str) -> None:
    """Writes the checkpoint in `model_dir` as an fp32 GGUF file for llama.cpp's llama arch."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tensors = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(model_dir, name)))
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads

    def rope_rows(w, n_head):
        # HF rotates (x[i], x[i + d/2]); llama.cpp rotates (x[2i], x[2i + 1]): reorder the rows.
        return (w.reshape(n_head, 2, head_dim // 2, -1).swapaxes(1, 2).reshape(w.shape))

    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(0)  # all fp32
    w.add_tokenizer_model("no_vocab")
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight"}
    for hf_name, t in tensors.items():
        t = np.ascontiguousarray(t.astype(np.float32))
        if hf_name in names:
            w.add_tensor(names[hf_name], t)
            continue
        _, _, layer, rest = hf_name.split(".", 3)  # model.layers.<i>.<rest>
        if rest == "self_attn.q_proj.weight":
            t = rope_rows(t, heads)
        elif rest == "self_attn.k_proj.weight":
            t = rope_rows(t, kv_heads)
        w.add_tensor(f"blk.{layer}.{per_layer[rest]}", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class Engine:
    """A llama.cpp context with continuous batching over its unified KV cache."""

    def __init__(self, gguf_path: str, max_seqs: int, seq_tokens: int, threads: int,
                 kv_unified: bool):
        import llama_cpp as L
        import numpy as np

        self.L, self.np = L, np
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(gguf_path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = max_seqs * seq_tokens
        cp.n_batch = cp.n_ubatch = 2048
        cp.n_seq_max = max_seqs
        cp.n_threads = cp.n_threads_batch = threads
        # Unified: one KV buffer, every sequence decoded in one ubatch, but each token's
        # attention spans every sequence's cells (masked). Not unified: n_ctx / n_seq_max cells
        # per sequence, and the batch is split by sequence (the weights are read once per
        # sequence). Here unified wins on "small" (matmul-bound), per-sequence on "tiny".
        cp.kv_unified = kv_unified
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = L.GGML_TYPE_F32
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.mem = L.llama_get_memory(self.ctx)
        self.max_seqs, self.n_batch = max_seqs, 2048
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)

    def generate(self, reqs):
        """Greedy, forced lengths. Returns (generated tokens per request, steps)."""
        L, np = self.L, self.np
        waiting = list(range(len(reqs)))
        free_ids = list(range(self.max_seqs))
        running = {}  # request -> [seq id, tokens known, tokens computed]
        prefill = None  # [request, seq id, prompt, tokens computed]: a prompt cut across steps
        outs = [[] for _ in reqs]
        steps = 0
        while waiting or running or prefill:
            b, n, rows = self.batch, 0, []  # rows: (request, batch row) to sample from
            for i, st in running.items():  # every running sequence feeds its last token
                seq, toks, done = st
                b.token[n], b.pos[n], b.n_seq_id[n], b.seq_id[n][0], b.logits[n] = (
                    toks[done], done, 1, seq, 1)
                rows.append((i, n))
                st[2] += 1
                n += 1
            while n < self.n_batch and (prefill or (waiting and free_ids)):
                if prefill is None:
                    i = waiting.pop(0)
                    prefill = [i, free_ids.pop(), list(reqs[i]["prompt_token_ids"]), 0]
                i, seq, toks, done = prefill
                take = min(len(toks) - done, self.n_batch - n)
                for p in range(done, done + take):
                    b.token[n], b.pos[n], b.n_seq_id[n], b.seq_id[n][0] = toks[p], p, 1, seq
                    b.logits[n] = 1 if p == len(toks) - 1 else 0
                    n += 1
                prefill[3] += take
                if prefill[3] == len(toks):  # prompt done: its last row gives the first token
                    running[i] = [seq, toks, len(toks)]
                    rows.append((i, n - 1))
                    prefill = None
            b.n_tokens = n
            rc = L.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            steps += 1
            for i, row in rows:
                logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, row),
                                               (self.n_vocab,))
                tok = int(logits.argmax())
                outs[i].append(tok)
                running[i][1].append(tok)
                if len(outs[i]) == reqs[i]["max_tokens"]:
                    L.llama_memory_seq_rm(self.mem, running[i][0], -1, -1)
                    free_ids.append(running.pop(i)[0])
        return outs, steps


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--max-seqs", type=int, default=64)
    ap.add_argument("--seq-tokens", type=int, default=2048, help="KV slots per sequence")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--kv-unified", action="store_true", help="one KV buffer for all sequences")
    args = ap.parse_args()
    import llama_cpp

    t0 = time.perf_counter()
    path = args.model.rstrip("/") + "-f32.gguf"  # beside the checkpoint, not in it
    if not os.path.exists(path):
        write_gguf(args.model, path + ".tmp")
        os.replace(path + ".tmp", path)
    engine = Engine(path, args.max_seqs, args.seq_tokens, args.threads, args.kv_unified)
    reply({"event": "ready", "startup_s": time.perf_counter() - t0,
           "version": llama_cpp.__version__, "max_seqs": args.max_seqs,
           "seq_tokens": args.seq_tokens, "threads": args.threads, "kv_cache": "f32",
           "flash_attn": False, "kv_unified": args.kv_unified})

    def generate(cmd: dict) -> dict:
        t = time.perf_counter()
        outs, steps = engine.generate(cmd["requests"])
        return {"event": "result", "elapsed_s": time.perf_counter() - t,
                "output_tokens": sum(len(o) for o in outs),
                "first_tokens": [o[:cmd.get("keep", 8)] for o in outs], "extra": {"steps": steps}}

    serve({"generate": generate})


if __name__ == "__main__":
    sys.exit(main())
