"""From the engine's cumulative outputs to the increments a streaming client is sent.

Streaming with stop strings: the engine cuts a completion's text before a stop string once the
string is complete, but a prefix of it may already have been produced. So while a choice runs,
the last ``len(longest stop) - 1`` characters are held back; a stop string that completes later
starts at or after the held-back point, so nothing that was sent is ever cut. The rest goes
out with the finishing delta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from pagedllm.outputs import CompletionOutput, PositionLogprobs


@dataclass
class Delta:
    """What one choice gained since the last delta.

    Attributes:
        text: the new text.
        token_ids: the new token ids.
        logprobs: per new token, its logprobs (None unless requested).
        text_offset: offset of the first new token's text in the choice's whole text (for
            logprobs; past the end of what was sent while characters are held back).
        finish_reason: set on the last delta of the choice.
        stop_reason: the stop string / token id that ended it, if any.
    """

    text: str
    token_ids: List[int]
    logprobs: Optional[List[PositionLogprobs]]
    text_offset: int
    finish_reason: Optional[str]
    stop_reason: object


class ChoiceTracker:
    """Remembers how much of one choice was sent.

    Args:
        holdback: characters kept back while the choice runs (longest stop string - 1).
    """

    def __init__(self, holdback: int = 0):
        self.holdback = holdback
        self.text_sent = 0
        self.tokens_sent = 0
        self.tokens_text_end = 0  # length of the choice's text when tokens_sent were sent
        self.done = False

    def advance(self, comp: CompletionOutput) -> Optional[Delta]:
        """The delta of `comp` over what was sent, or None when there is nothing new to send.

        A delta is emitted when there is new text or the choice finished; tokens without text
        yet (an incomplete character, held-back text) wait for the next delta.
        """
        if self.done:
            return None
        finished = comp.finish_reason is not None
        text = comp.text
        end = len(text) if finished else max(self.text_sent, len(text) - self.holdback)
        new_text = text[self.text_sent:end]
        if not new_text and not finished:
            return None
        token_ids = list(comp.token_ids[self.tokens_sent:])
        logprobs = comp.logprobs[self.tokens_sent:] if comp.logprobs is not None else None
        delta = Delta(new_text, token_ids, logprobs, self.tokens_text_end,
                      comp.finish_reason, comp.stop_reason)
        self.text_sent += len(new_text)
        self.tokens_text_end = len(text)
        self.tokens_sent = len(comp.token_ids)
        self.done = finished
        return delta


def holdback_for(stops: List[str]) -> int:
    """Characters to hold back while streaming with these stop strings."""
    return max((len(s) for s in stops), default=1) - 1
