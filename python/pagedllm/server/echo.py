"""Echo and scoring in /v1/completions: the prompt's text and logprobs in front of a choice,
and max_tokens 0 (the engine runs one token, which is dropped)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, List, Optional

from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.server.generation import Prompt
from pagedllm.server.logprobs import echo_logprobs
from pagedllm.server.protocol import CompletionRequest
from pagedllm.server.responses import CompletionLogprobs
from pagedllm.server.state import ServerState


def scored_only(comp: CompletionOutput) -> CompletionOutput:
    """A choice of a max_tokens 0 request: the one token the engine ran is dropped.

    Args:
        comp: the engine's completion (one token).
    Returns:
        The completion with no text, no tokens and finish_reason "length" once finished.
    """
    return replace(comp, text="", token_ids=[],
                   logprobs=[] if comp.logprobs is not None else None,
                   finish_reason="length" if comp.finish_reason is not None else None,
                   stop_reason=None)


def outputs_of(req: CompletionRequest, out: RequestOutput) -> List[CompletionOutput]:
    """The completions of an engine output as the client asked for them (none generated with
    max_tokens 0)."""
    return [scored_only(c) for c in out.outputs] if req.max_tokens == 0 else list(out.outputs)


def _decoder(state: ServerState) -> Callable[[int], str]:
    tk = state.tokenizer
    if tk is None:
        return lambda tid: f"token_id:{tid}"
    return lambda tid: tk.decode([tid], skip_special_tokens=False)


def echo_text(state: ServerState, p: Prompt) -> str:
    """The text echoed for a prompt: as given, or decoded from its token ids."""
    if p.text is not None:
        return p.text
    return state.tokenizer.decode(p.token_ids) if state.tokenizer is not None else ""


def prompt_echo_logprobs(state: ServerState, req: CompletionRequest, p: Prompt,
                         out: RequestOutput) -> Optional[CompletionLogprobs]:
    """The logprobs of an echoed prompt's tokens (None unless the request asked for logprobs).

    Args:
        state: the server (for the tokenizer).
        req: the request.
        p: the prompt.
        out: an engine output of that prompt (it carries the prompt logprobs).
    Returns:
        The prompt part of the choice's logprobs.
    """
    if req.logprobs is None:
        return None
    return echo_logprobs(p.token_ids, out.prompt_logprobs, req.logprobs, _decoder(state),
                         req.return_tokens_as_token_ids, text=echo_text(state, p))
