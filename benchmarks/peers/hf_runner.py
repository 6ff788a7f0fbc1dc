"""Hugging Face transformers `generate` as a peer: padded static batches, its default KV cache.

What a user without a serving engine does: cut the requests, in arrival order, into batches of
`batch_size`, left-pad the prompts, and call `generate` with greedy decoding. A batch runs until
its longest request is done (every row is forced to that length with min_new_tokens, so EOS
never stops a row early), so only each request's own tokens count ("useful" tokens per second):
padding and the tokens generated past a request's length are waste.
"""

from __future__ import annotations

import time
from typing import List, Sequence

import torch

from benchmarks.engines import KEEP_TOKENS, RunResult
from benchmarks.workloads import BenchRequest

PAD_ID = 0


class HFPeer:
    """transformers' LlamaForCausalLM on the benchmark checkpoint, fp32, eval mode.

    Args:
        model_dir: the checkpoint directory (the same one pagedllm loads).
    """

    name = "transformers"

    def __init__(self, model_dir: str):
        import transformers
        from transformers import LlamaForCausalLM

        t0 = time.perf_counter()
        self.model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.startup_s = time.perf_counter() - t0
        self.version = transformers.__version__
        self.attn_implementation = self.model.config._attn_implementation

    @torch.inference_mode()
    def _batch(self, reqs: Sequence[BenchRequest]) -> List[List[int]]:
        width = max(len(r.prompt_token_ids) for r in reqs)
        new = max(r.max_tokens for r in reqs)
        # input_ids, attention_mask: [batch, width], left-padded
        ids = torch.full((len(reqs), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(reqs), width), dtype=torch.long)
        for i, r in enumerate(reqs):
            n = len(r.prompt_token_ids)
            ids[i, width - n:] = torch.tensor(r.prompt_token_ids)
            mask[i, width - n:] = 1
        out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                                  min_new_tokens=new, do_sample=False, pad_token_id=PAD_ID)
        # out: [batch, width + new]
        return [out[i, width:width + r.max_tokens].tolist() for i, r in enumerate(reqs)]

    def generate(self, reqs: List[BenchRequest], batch_size: int) -> RunResult:
        """Runs `reqs` in arrival-order batches of `batch_size` and times the whole.

        Returns:
            The RunResult: output_tokens = the requests' own lengths (useful tokens).
        """
        t0 = time.perf_counter()
        tokens: List[List[int]] = []
        computed = 0
        for i in range(0, len(reqs), batch_size):
            batch = reqs[i:i + batch_size]
            tokens += self._batch(batch)
            computed += len(batch) * max(r.max_tokens for r in batch)
        elapsed = time.perf_counter() - t0
        useful = sum(r.max_tokens for r in reqs)
        return RunResult(self.name, elapsed, useful, [t[:KEEP_TOKENS] for t in tokens],
                         extra={"batch_size": batch_size, "generated_incl_waste": computed,
                                "useful_fraction": round(useful / computed, 4)})

    def best_batch_size(self, reqs: List[BenchRequest], candidates: Sequence[int]) -> dict:
        """Useful tokens/s of each candidate batch size on `reqs`; the best one.

        Returns:
            {"best": size, "tokens_per_s": {size: rate}} measured on `reqs`.
        """
        rates = {}
        for bs in candidates:
            rates[bs] = round(self.generate(reqs, bs).tokens_per_s, 2)
        return {"best": max(rates, key=rates.get), "tokens_per_s": rates,
                "num_requests": len(reqs)}
