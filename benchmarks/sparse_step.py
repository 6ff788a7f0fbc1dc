"""A model decode step at long context without a prefill, for bench_sparse.py: a random
4-layer fp32 Llama with the benchmark's attention shape (32 / 8 heads of 128, hidden 1024, so
attention is most of a long-context step as in larger models), its bf16 KV pool filled with
random keys and values (and their quest bounds) as if `ctx` tokens had been computed."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch

from pagedllm.model import AttentionMetadata, PagedKVCache
from pagedllm.model.checkpoint import random_config
from pagedllm.model.llama import LlamaForCausalLM
from pagedllm.sparse import SparseAttentionConfig
from pagedllm.sparse.attend import SparseStep
from pagedllm.sparse.plan import plan_step

MODEL = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=32,
             num_key_value_heads=8, head_dim=128, intermediate_size=1024, vocab_size=1024,
             max_position_embeddings=65536)


class ModelStep:
    """Times one decode step of `batch` sequences of `ctx` tokens."""

    def __init__(self, batch: int, ctx: int, block_size: int):
        cfg = random_config(MODEL)
        torch.manual_seed(0)
        self.model = LlamaForCausalLM(cfg, dtype=torch.float32).eval()
        with torch.no_grad():
            for p in self.model.parameters():
                p.normal_(0.0, 0.02)
        blocks_per_seq = ctx // block_size + 1
        self.kv = PagedKVCache(cfg, batch * blocks_per_seq, block_size, "bf16",
                               dtype=torch.float32, key_bounds=True)
        self.kv.pool.normal_()
        for layer in range(cfg.num_hidden_layers):
            lo, hi = self.kv.key_bounds(layer)
            keys = self.kv.key_cache(layer)
            lo.copy_(keys.amin(dim=2))
            hi.copy_(keys.amax(dim=2))
        self.batch, self.ctx, self.bs = batch, ctx, block_size
        self.tables = np.arange(batch * blocks_per_seq, dtype=np.int32).reshape(batch, -1)
        self.lens = np.full(batch, ctx + 1, dtype=np.int32)
        self.slots = (self.tables[:, ctx // block_size].astype(np.int64) * block_size
                      + ctx % block_size)

    @torch.inference_mode()
    def time(self, cfg: Optional[SparseAttentionConfig]) -> float:
        """Seconds of one decode step under cfg (None: dense)."""
        t0 = time.perf_counter()
        plan = plan_step([cfg] * self.batch, self.lens, self.bs) if cfg is not None else None
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(self.slots), block_tables=torch.from_numpy(self.tables),
            context_lens=torch.from_numpy(self.lens),
            cu_seqlens_q=torch.arange(self.batch + 1, dtype=torch.int32),
            num_decode_seqs=self.batch,
            sparse=SparseStep.build(plan, torch.device("cpu")) if plan is not None else None)
        ids = torch.zeros(self.batch, dtype=torch.int64)
        pos = torch.from_numpy(self.lens.astype(np.int64) - 1)
        self.model.compute_logits(self.model(ids, pos, meta, self.kv))
        return time.perf_counter() - t0
