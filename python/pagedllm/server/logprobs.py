"""Logprobs in OpenAI's two shapes: /v1/completions' parallel lists and /v1/chat/completions'
per-token objects, plus vLLM's ``prompt_logprobs`` (per prompt token, keyed by token id)."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

from pagedllm.outputs import PositionLogprobs
from pagedllm.server.responses import (ChatLogprobs, ChatTokenLogprob, ChatTopLogprob,
                                       CompletionLogprobs, PromptLogprob)

# JSON has no -inf; OpenAI-compatible servers report this floor instead (as vLLM does).
MIN_LOGPROB = -9999.0


def _token_text(tid: int, lp, as_ids: bool = False) -> str:
    if as_ids or lp is None or lp.decoded_token is None:
        return f"token_id:{tid}"
    return lp.decoded_token


def _top(pos: PositionLogprobs, k: int) -> list:
    """The k best entries of one position, best first, as (token id, Logprob)."""
    ranked = sorted(pos.items(), key=lambda kv: (kv[1].rank or 1 << 30))
    return ranked[:k]


def _clamp(x: float) -> float:
    return max(x, MIN_LOGPROB)


def completion_logprobs(token_ids: List[int], positions: List[PositionLogprobs], k: int,
                        text_offset: int, as_ids: bool = False) -> CompletionLogprobs:
    """/v1/completions logprobs of some generated tokens.

    Args:
        token_ids: the tokens.
        positions: their logprobs, one dict per token (from the engine).
        k: number of alternatives in top_logprobs (the sampled token is added when not among).
        text_offset: offset of the first token's text in the choice text.
        as_ids: name tokens "token_id:<id>" (vLLM's return_tokens_as_token_ids).
    Returns:
        The logprobs object.
    """
    out = CompletionLogprobs()
    offset = text_offset
    for tid, pos in zip(token_ids, positions):
        chosen = pos[tid]
        token = _token_text(tid, chosen, as_ids)
        out.tokens.append(token)
        out.token_logprobs.append(_clamp(chosen.logprob))
        # Keyed by text, so tokens with the same text (e.g. partial UTF-8 "\ufffd") share one
        # entry: the most likely keeps it.
        top: Dict[str, float] = {}
        for t, lp in _top(pos, k):
            top.setdefault(_token_text(t, lp, as_ids), _clamp(lp.logprob))
        top.setdefault(token, _clamp(chosen.logprob))
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(token)
    return out


def echo_logprobs(token_ids: List[int], positions: Optional[List[Optional[PositionLogprobs]]],
                  k: int, decode: Callable[[int], str], as_ids: bool = False,
                  text: Optional[str] = None) -> CompletionLogprobs:
    """/v1/completions logprobs of an echoed prompt: the first token has none (null), as in
    OpenAI's legacy API and vLLM.

    Args:
        token_ids: the prompt's tokens.
        positions: the engine's prompt_logprobs (None first, then one dict per token).
        k: alternatives per token.
        decode: the text of a token id (for the first token, which has no entry).
        as_ids: name tokens "token_id:<id>".
        text: the echoed prompt text, which the offsets index (None: the tokens' own text).
            Tokens whose text is not in it (a bos the tokenizer added) get offset 0, and no
            offset passes len(text), where the generated tokens' offsets start.
    Returns:
        The logprobs object, text offsets from 0, never decreasing.
    """
    out = CompletionLogprobs()
    offset = 0
    positions = positions or []
    for i, tid in enumerate(token_ids):
        pos = positions[i] if i < len(positions) else None
        if pos is None or tid not in pos:
            token = f"token_id:{tid}" if as_ids else decode(tid)
            out.tokens.append(token)
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            part = completion_logprobs([tid], [pos], k, offset, as_ids)
            token = part.tokens[0]
            out.tokens.append(token)
            out.token_logprobs.extend(part.token_logprobs)
            out.top_logprobs.extend(part.top_logprobs)
        out.text_offset.append(offset)
        offset += len(token)
    if text is not None:
        joined = "".join(out.tokens)
        shift = len(joined) - len(text) if joined.endswith(text) else 0
        out.text_offset = [min(max(o - shift, 0), len(text)) for o in out.text_offset]
    return out


def concat(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    """The logprobs of a's tokens followed by b's."""
    return CompletionLogprobs(tokens=a.tokens + b.tokens,
                              token_logprobs=a.token_logprobs + b.token_logprobs,
                              top_logprobs=a.top_logprobs + b.top_logprobs,
                              text_offset=a.text_offset + b.text_offset)


def prompt_logprobs(token_ids: List[int], positions: Optional[List[Optional[PositionLogprobs]]],
                    k: int) -> List[Optional[Dict[int, PromptLogprob]]]:
    """vLLM's prompt_logprobs: per prompt token, null for the first, else {token id:
    {logprob, rank, decoded_token}} holding the actual token and the k most likely."""
    out: List[Optional[Dict[int, PromptLogprob]]] = []
    positions = positions or []
    for i, tid in enumerate(token_ids):
        pos = positions[i] if i < len(positions) else None
        if pos is None:
            out.append(None)
            continue
        keep = dict(_top(pos, k))
        if tid in pos:
            keep.setdefault(tid, pos[tid])
        out.append({t: PromptLogprob(logprob=_clamp(lp.logprob), rank=lp.rank,
                                     decoded_token=lp.decoded_token)
                    for t, lp in keep.items()})
    return out


def chat_logprobs(token_ids: List[int], positions: List[PositionLogprobs], k: int,
                  as_ids: bool = False) -> ChatLogprobs:
    """/v1/chat/completions logprobs of some generated tokens (k alternatives each; tokens
    named "token_id:<id>" when `as_ids`)."""
    content = []
    for tid, pos in zip(token_ids, positions):
        chosen = pos[tid]
        token = _token_text(tid, chosen, as_ids)
        top = [ChatTopLogprob(token=_token_text(t, lp, as_ids), logprob=_clamp(lp.logprob),
                              bytes=list(_token_text(t, lp).encode("utf-8")))
               for t, lp in _top(pos, k)]
        content.append(ChatTokenLogprob(token=token, logprob=_clamp(chosen.logprob),
                                        bytes=list(_token_text(tid, chosen).encode("utf-8")),
                                        top_logprobs=top))
    return ChatLogprobs(content=content)
