"""What generation returns, with vLLM's class and field names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class Logprob:
    """The log-probability of one token at one position.

    Args:
        logprob: natural-log probability under the model (before sampling adjustments).
        rank: 1 for the most likely token at that position.
        decoded_token: the token's text, when a tokenizer is available.
    """

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# One position: token id -> its Logprob (the top-k plus the chosen token).
PositionLogprobs = Dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One completion of a request.

    Args:
        index: the completion's index among the request's n.
        text: the generated text (stop string excluded unless asked for).
        token_ids: the generated token ids.
        cumulative_logprob: sum of the generated tokens' logprobs (None unless computed).
        logprobs: per generated token, the top-k logprobs (None unless requested).
        finish_reason: "stop", "length", "abort", "error", or None while running.
        stop_reason: the stop string or stop token id that ended it, if any.
    """

    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[PositionLogprobs]]
    finish_reason: Optional[str] = None
    stop_reason: Optional[object] = None

    def finished(self) -> bool:
        """True once the completion has a finish reason."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request: its prompt and its completions so far.

    Args:
        request_id: the id given to (or made by) the engine.
        prompt: the prompt text, if it was given as text.
        prompt_token_ids: the prompt's token ids.
        prompt_logprobs: per prompt token (None for the first), when requested.
        outputs: the completions (n of them once finished).
        finished: True when every completion has finished.
        metrics: timing of the request (arrival, first token, finish), in seconds.
        error: why the engine failed the request (finish_reason "error"), else None.
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    prompt_logprobs: Optional[List[Optional[PositionLogprobs]]]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Dict[str, float] = field(default_factory=dict)
    error: Optional[str] = None


@dataclass
class BeamSearchSequence:
    """One finished beam.

    Args:
        tokens: prompt plus generated token ids.
        logprobs: per generated token, the chosen token's Logprob.
        cum_logprob: sum of the generated tokens' logprobs.
        text: the decoded generated text.
        finish_reason: "stop" (EOS) or "length".
    """

    tokens: List[int]
    logprobs: List[PositionLogprobs]
    cum_logprob: float
    text: Optional[str] = None
    finish_reason: Optional[str] = None


@dataclass
class BeamSearchOutput:
    """The beams of one prompt, best first.

    Args:
        sequences: up to beam_width finished beams sorted by length-penalised score.
    """

    sequences: List[BeamSearchSequence]


def beam_request_output(request_id: str, prompt: Optional[str], prompt_token_ids: List[int],
                        beams: BeamSearchOutput, n: int,
                        error: Optional[str] = None) -> RequestOutput:
    """A finished beam search as a RequestOutput: its `n` best beams as the completions.

    Args:
        request_id: the request's id.
        prompt: the prompt text (None when given as ids).
        prompt_token_ids: the prompt's token ids (beams' tokens start with them).
        beams: the search's result, best first.
        n: completions to return.
        error: why the engine failed the search (then there are no completions).
    Returns:
        A finished RequestOutput (cumulative_logprob set on each completion).
    """
    plen = len(prompt_token_ids)
    outs = [CompletionOutput(index=i, text=b.text or "", token_ids=b.tokens[plen:],
                             cumulative_logprob=b.cum_logprob, logprobs=None,
                             finish_reason=b.finish_reason)
            for i, b in enumerate(beams.sequences[:n])]
    return RequestOutput(request_id, prompt, list(prompt_token_ids), None, outs, True,
                         error=error)
