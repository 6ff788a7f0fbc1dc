"""Applies a step's samples to the sequences and builds the RequestOutputs.

For every sampled sequence: append the token, record logprobs, extend the text and check the
stop rules (the scheduler then finishes the sequence and frees its blocks). Called only by the
scheduler's update_from_output, the one owner of request state.
"""

from __future__ import annotations

from typing import Optional

import torch

from pagedllm.engine.sampler import SampleResult
from pagedllm.engine.sequence import Request, Sequence
from pagedllm.engine.stop_checker import StopChecker
from pagedllm.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput


class OutputProcessor:
    """Turns sample results into sequence state and outputs (the scheduler's helper).

    Args:
        stop_checker: the stop rules and detokenization.
        tokenizer: for decoded_token in logprobs (None: no text).
    """

    def __init__(self, stop_checker: StopChecker, tokenizer=None):
        self.stop = stop_checker
        self.tokenizer = tokenizer

    def apply(self, seq: Sequence, result: SampleResult, now: float) -> Optional[str]:
        """Appends the sampled token to `seq`.

        Returns:
            The finish reason when a stop rule ends the sequence, else None.
        """
        req = seq.request
        seq.token_ids.append(result.token_id)
        if req.first_token_time is None:
            req.first_token_time = now
        if result.logprob is not None:
            seq.cumulative_logprob += result.logprob
        if seq.output_logprobs is not None:
            seq.output_logprobs.append(self._position_logprobs(result))
        delta = self.stop.append_text(seq)
        return self.stop.check(seq, delta)

    def add_prompt_logprobs(self, seq: Sequence, start: int, logits: torch.Tensor) -> None:
        """Records prompt logprobs for the chunk of prompt rows starting at position `start`.

        Args:
            seq: the request's first sequence (prompt logprobs are per request).
            start: position of the chunk's first token.
            logits: float32 [chunk_len, vocab]; row i predicts the token at start + i + 1.
        """
        req = seq.request
        k = req.params.prompt_logprobs or 0
        end = min(start + logits.shape[0], seq.num_prompt_tokens - 1)
        # A recomputation after preemption may cover positions already recorded (with other
        # chunk boundaries): record only the positions not seen yet.
        first = len(req.prompt_logprobs) - 1
        if end <= first or first < start:
            return
        lp = torch.log_softmax(logits[first - start:end - start].float(), dim=-1)  # [rows, vocab]
        start = first
        targets = torch.as_tensor(req.prompt_token_ids[start + 1:end + 1], dtype=torch.long)
        chosen = lp.gather(1, targets.unsqueeze(1)).squeeze(1)             # [rows]
        ranks = (lp > chosen.unsqueeze(1)).sum(dim=1) + 1
        top_vals, top_ids = (torch.topk(lp, min(k, lp.shape[1]), dim=-1) if k > 0
                             else (None, None))
        tids, lps, rks = targets.tolist(), chosen.tolist(), ranks.tolist()
        for i in range(end - start):
            top = list(zip(top_ids[i].tolist(), top_vals[i].tolist())) if k > 0 else None
            req.prompt_logprobs.append(
                self._position_logprobs(SampleResult(tids[i], lps[i], rks[i], top)))

    def _position_logprobs(self, r: SampleResult) -> PositionLogprobs:
        pos: PositionLogprobs = {r.token_id: Logprob(r.logprob, r.rank, self._decode(r.token_id))}
        for rank, (tid, val) in enumerate(r.top or []):
            pos.setdefault(tid, Logprob(val, rank + 1, self._decode(tid)))
        return pos

    def _decode(self, token_id: int) -> Optional[str]:
        return self.tokenizer.decode([token_id], skip_special_tokens=False) if self.tokenizer else None

    # --- outputs ------------------------------------------------------------------------------
    @staticmethod
    def request_output(req: Request, finished: Optional[bool] = None) -> RequestOutput:
        """The request's current state as vLLM's RequestOutput (`finished`: req.finished, when
        the caller has it).

        With best_of > n, the n completions of highest cumulative logprob are returned once the
        request has finished (all best_of samples while it runs). The prompt_token_ids list is
        one copy shared by the request's outputs (a stream of long prompts copied it per step).
        """
        seqs = list(req.seqs)
        if finished is None:
            finished = req.finished
        params = req.params
        if finished and params.best_of > params.n:
            seqs = sorted(seqs, key=lambda s: s.cumulative_logprob, reverse=True)[: params.n]
        want_cum = params.logprobs is not None or params.best_of > params.n
        outputs = [
            CompletionOutput(
                index=s.index if not (finished and params.best_of > params.n) else rank,
                text=s.output_text,
                token_ids=s.token_ids[s.num_prompt_tokens:],
                cumulative_logprob=s.cumulative_logprob if want_cum else None,
                logprobs=list(s.output_logprobs) if s.output_logprobs is not None else None,
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
            )
            for rank, s in enumerate(seqs)
        ]
        metrics = {"arrival_time": req.arrival_time}
        if req.first_token_time is not None:
            metrics["first_token_time"] = req.first_token_time
        if req.finish_time is not None:
            metrics["finish_time"] = req.finish_time
        if req.prompt_ids_out is None:  # one copy per request, not one per streamed step
            req.prompt_ids_out = list(req.prompt_token_ids)
        return RequestOutput(req.request_id, req.prompt, req.prompt_ids_out,
                             list(req.prompt_logprobs) if req.prompt_logprobs is not None else None,
                             outputs, finished, metrics, req.error)
