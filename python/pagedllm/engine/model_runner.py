"""Turns a SchedulerOutput into tensors, runs the model and returns the logits to sample from.

The runner owns the paged KV pool's tensors. Per step: copy-on-write block copies first, then
one forward over the packed new tokens of every scheduled sequence, then logits only for the
rows that are needed (the last token of every sequence whose known tokens are now all computed,
plus every prompt row of sequences that asked for prompt logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch

from pagedllm.engine.scheduler import SchedulerOutput
from pagedllm.model import AttentionMetadata, PagedKVCache


@dataclass
class StepLogits:
    """Logits produced by one step.

    Attributes:
        sample_entries: indices into SchedulerOutput.scheduled of the sequences to sample.
        logits: float32 [len(sample_entries), vocab], one row per entry in that order.
        prompt_logits: entry index -> float32 [num_new_tokens, vocab] for prompt logprobs.
    """

    sample_entries: List[int]
    logits: torch.Tensor
    prompt_logits: Dict[int, torch.Tensor]


class ModelRunner:
    """Runs the model over the paged KV cache.

    Args:
        model: the loaded Llama (pagedllm.model), in eval mode.
        kv_cache: the paged KV pool its attention reads and writes.
    """

    def __init__(self, model: torch.nn.Module, kv_cache: PagedKVCache):
        self.model = model
        self.kv_cache = kv_cache

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepLogits:
        """Runs one step. See the module docstring.

        Args:
            out: the scheduler's decision for this step (slots already reserved).
        Returns:
            The logits of the rows to sample from (and of prompt rows when requested).
        """
        if len(out.cow_pairs):
            self.kv_cache.copy_blocks(torch.from_numpy(out.cow_pairs))
        entries = out.scheduled
        num_seqs = len(entries)
        q_lens = np.fromiter((e.num_new_tokens for e in entries), dtype=np.int32, count=num_seqs)
        starts = np.fromiter((e.start for e in entries), dtype=np.int64, count=num_seqs)
        cu = np.zeros(num_seqs + 1, dtype=np.int32)
        np.cumsum(q_lens, out=cu[1:])
        num_tokens = int(cu[-1])

        # input_ids / positions: [num_tokens]
        if out.num_decode_seqs == num_seqs:  # pure decode: one token each
            input_ids = np.fromiter((e.seq.token_ids[e.start] for e in entries), dtype=np.int64,
                                    count=num_seqs)
            positions = starts
        else:
            ids: List[int] = []
            for e in entries:
                ids.extend(e.seq.token_ids[e.start:e.start + e.num_new_tokens])
            input_ids = np.asarray(ids, dtype=np.int64)
            positions = np.repeat(starts - cu[:-1], q_lens) + np.arange(num_tokens)
        context_lens = (starts + q_lens).astype(np.int32)

        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(out.slot_mapping),        # [num_tokens] int64
            block_tables=torch.from_numpy(out.block_tables),        # [num_seqs, W] int32
            context_lens=torch.from_numpy(context_lens),            # [num_seqs] int32
            cu_seqlens_q=torch.from_numpy(cu),                      # [num_seqs + 1] int32
            num_decode_seqs=out.num_decode_seqs,
        )
        hidden = self.model(torch.from_numpy(input_ids), torch.from_numpy(positions), meta,
                            self.kv_cache)                          # [num_tokens, hidden]

        sample_entries = [i for i, e in enumerate(entries) if e.context_len == e.seq.num_tokens]
        last_rows = torch.as_tensor([int(cu[i + 1]) - 1 for i in sample_entries], dtype=torch.long)
        prompt_logits: Dict[int, torch.Tensor] = {}
        for i, e in enumerate(entries):
            if e.seq.request.prompt_logprobs is not None and e.start < e.seq.num_prompt_tokens - 1:
                rows = hidden[int(cu[i]):int(cu[i + 1])]             # [q_len, hidden]
                prompt_logits[i] = self.model.compute_logits(rows)  # [q_len, vocab]
        logits = (self.model.compute_logits(hidden[last_rows]) if sample_entries
                  else hidden.new_zeros((0, 0)))                    # [num_sample, vocab]
        return StepLogits(sample_entries, logits, prompt_logits)
