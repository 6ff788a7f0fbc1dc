"""Beam search over forked sequences (vLLM's algorithm, run inside the engine).

Each live beam is a Sequence. When a beam's next-token logits are computed, its
2 * beam_width best continuations are stored on it. Once every live beam of the request has
its candidates, all candidates are ranked by cumulative logprob: EOS continuations become
finished hypotheses, the best beam_width others become the new beams. A beam chosen k times is
forked k - 1 times (the forks share its KV blocks, copy-on-write); a beam not chosen is freed.
At the end the hypotheses are ranked by cumulative logprob / length ** length_penalty
(compared in log space: beam_rank_key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Tuple

import torch

from pagedllm.engine.sequence import Request, Sequence, SequenceStatus
from pagedllm.outputs import BeamSearchOutput, BeamSearchSequence, Logprob
from pagedllm.sampling_params import GREEDY_TEMPERATURE, BeamSearchParams


@dataclass
class BeamSearchState:
    """Per-request beam search bookkeeping."""

    params: BeamSearchParams
    completed: List[BeamSearchSequence] = field(default_factory=list)
    next_index: int = 1
    done: bool = False


def beam_rank_key(tokens: List[int], cum_logprob: float, eos_ids,
                  length_penalty: float) -> Tuple[int, float]:
    """A sort key, ascending = best first, for vLLM's length-penalised score
    cum_logprob / len ** length_penalty (EOS not counted in len).

    The score is ranked in log space (scores are <= 0, so a smaller log |score| is a better
    one; a score of 0 ranks first), so no finite length_penalty overflows or divides by zero
    (len ** 600 and len ** -600 are both past the float range)."""
    n = len(tokens)
    if tokens and tokens[-1] in eos_ids:
        n -= 1
    if cum_logprob >= 0.0:
        return (0, -cum_logprob)
    return (1, math.log(-cum_logprob) - length_penalty * math.log(max(n, 1)))


def store_candidates(seq: Sequence, logits: torch.Tensor, params: BeamSearchParams) -> None:
    """Keeps the 2 * beam_width best next tokens of `seq`. logits: float32 [vocab]."""
    x = logits.float()
    if params.temperature >= GREEDY_TEMPERATURE:  # tinier ones would overflow: plain logprobs
        x = x / params.temperature
    lp = torch.log_softmax(x, dim=-1)
    vals, ids = torch.topk(lp, min(2 * params.beam_width, lp.shape[0]))
    seq.beam_pending = list(zip(ids.tolist(), vals.tolist()))


def ready(req: Request) -> bool:
    """True when every live beam of `req` has its candidates."""
    live = [s for s in req.seqs if s.status is not SequenceStatus.FINISHED]
    return bool(live) and all(s.beam_pending is not None for s in live)


def advance(req: Request, scheduler, eos_ids, max_model_len: int, free_seq) -> None:
    """Ranks the candidates of every live beam and moves `req` to its next set of beams.

    Args:
        req: a beam-search request whose beams are all ready().
        scheduler: owns the KV blocks (forks go through it).
        eos_ids: end-of-sequence ids.
        max_model_len: longest sequence allowed.
        free_seq: callable(seq) that finishes a beam and frees its blocks.
    """
    state: BeamSearchState = req.beam
    p = state.params
    live = [s for s in req.seqs if s.status is not SequenceStatus.FINISHED]
    cands = []
    for s in live:
        for tok, lp in s.beam_pending:
            cands.append((s.cumulative_logprob + lp, s.index, s, tok, lp))
        s.beam_pending = None
    cands.sort(key=lambda c: (-c[0], c[1]))
    chosen = []
    for score, _, s, tok, lp in cands:
        if tok in eos_ids and not p.ignore_eos:
            state.completed.append(BeamSearchSequence(
                tokens=s.token_ids + [tok], logprobs=s.beam_logprobs + [{tok: Logprob(lp)}],
                cum_logprob=score, finish_reason="stop"))
        elif len(chosen) < p.beam_width:
            chosen.append((s, tok, lp, score))

    # Fork before any parent grows: a parent chosen k times gets k - 1 copies.
    claimed = set()
    new_beams = []
    for s, tok, lp, score in chosen:
        if s.seq_id not in claimed:
            claimed.add(s.seq_id)
            beam = s
        else:
            beam = Sequence(req, state.next_index, s.token_ids, None)
            state.next_index += 1
            beam.beam_logprobs = list(s.beam_logprobs)
            if s.status is SequenceStatus.RUNNING:
                scheduler.fork(s, beam)
            else:
                scheduler.add_beam(beam)  # the parent holds no device blocks: recompute
        new_beams.append((beam, tok, lp, score))
    for s in live:
        if s.seq_id not in claimed:
            free_seq(s)
    for beam, tok, lp, score in new_beams:
        beam.token_ids.append(tok)
        beam.cumulative_logprob = score
        beam.beam_logprobs.append({tok: Logprob(lp)})
    req.seqs = [b for b, _, _, _ in new_beams]

    out_len = req.seqs[0].num_output_tokens if req.seqs else 0
    if not req.seqs or out_len >= p.max_tokens or req.seqs[0].num_tokens >= max_model_len:
        for b in req.seqs:
            state.completed.append(BeamSearchSequence(
                tokens=list(b.token_ids), logprobs=list(b.beam_logprobs),
                cum_logprob=b.cumulative_logprob, finish_reason="length"))
            free_seq(b)
        state.done = True


def result(req: Request, eos_ids, tokenizer=None) -> BeamSearchOutput:
    """The best beam_width hypotheses of a finished beam-search request, best first."""
    state: BeamSearchState = req.beam
    p = state.params
    ranked = sorted(state.completed,
                    key=lambda b: beam_rank_key(b.tokens, b.cum_logprob, eos_ids,
                                                p.length_penalty))[: p.beam_width]
    for b in ranked:
        if tokenizer is not None:
            b.text = tokenizer.decode(b.tokens[len(req.prompt_token_ids):])
    return BeamSearchOutput(sequences=ranked)
