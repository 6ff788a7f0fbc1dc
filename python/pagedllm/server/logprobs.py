"""Logprobs in OpenAI's two shapes: /v1/completions' parallel lists and /v1/chat/completions'
per-token objects."""

from __future__ import annotations

from typing import Dict, List

from pagedllm.outputs import PositionLogprobs
from pagedllm.server.responses import ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs

# JSON has no -inf; OpenAI-compatible servers report this floor instead (as vLLM does).
MIN_LOGPROB = -9999.0


def _token_text(tid: int, lp) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{tid}"


def _top(pos: PositionLogprobs, k: int) -> list:
    """The k best entries of one position, best first, as (token id, Logprob)."""
    ranked = sorted(pos.items(), key=lambda kv: (kv[1].rank or 1 << 30))
    return ranked[:k]


def _clamp(x: float) -> float:
    return max(x, MIN_LOGPROB)


def completion_logprobs(token_ids: List[int], positions: List[PositionLogprobs], k: int,
                        text_offset: int) -> CompletionLogprobs:
    """/v1/completions logprobs of some generated tokens.

    Args:
        token_ids: the tokens.
        positions: their logprobs, one dict per token (from the engine).
        k: number of alternatives in top_logprobs (the sampled token is added when not among).
        text_offset: offset of the first token's text in the choice text.
    """
    out = CompletionLogprobs()
    offset = text_offset
    for tid, pos in zip(token_ids, positions):
        chosen = pos[tid]
        token = _token_text(tid, chosen)
        out.tokens.append(token)
        out.token_logprobs.append(_clamp(chosen.logprob))
        # Keyed by text, so tokens with the same text (e.g. partial UTF-8 "\ufffd") share one
        # entry: the most likely keeps it.
        top: Dict[str, float] = {}
        for t, lp in _top(pos, k):
            top.setdefault(_token_text(t, lp), _clamp(lp.logprob))
        top.setdefault(token, _clamp(chosen.logprob))
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(token)
    return out


def chat_logprobs(token_ids: List[int], positions: List[PositionLogprobs], k: int) -> ChatLogprobs:
    """/v1/chat/completions logprobs of some generated tokens (k alternatives each)."""
    content = []
    for tid, pos in zip(token_ids, positions):
        chosen = pos[tid]
        token = _token_text(tid, chosen)
        top = [ChatTopLogprob(token=_token_text(t, lp), logprob=_clamp(lp.logprob),
                              bytes=list(_token_text(t, lp).encode("utf-8")))
               for t, lp in _top(pos, k)]
        content.append(ChatTokenLogprob(token=token, logprob=_clamp(chosen.logprob),
                                        bytes=list(token.encode("utf-8")), top_logprobs=top))
    return ChatLogprobs(content=content)
