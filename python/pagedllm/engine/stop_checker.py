"""Decides when a sequence is done after each new token, and keeps its text up to date.

vLLM's rules, in order: EOS (unless ignore_eos), a stop token id (neither one's text is kept
unless include_stop_str_in_output), a stop string in the new text (the text is cut before it
unless include_stop_str_in_output), max_tokens, max_model_len.
EOS and stop tokens do not end a sequence before min_tokens tokens were generated.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Optional, Sequence as Seq

from pagedllm.engine.sequence import Sequence


class StopChecker:
    """Applies the stop rules.

    Args:
        eos_token_ids: the model's end-of-sequence ids.
        max_model_len: the longest sequence (prompt + output) the engine runs.
        tokenizer: a pagedllm.tokenizer.Tokenizer, or None (no text, no stop strings).
    """

    def __init__(self, eos_token_ids: Seq[int], max_model_len: int, tokenizer=None):
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self.clock = None  # a tracing.DetokenizeClock while a trace records (the engine sets it)

    def append_text(self, seq: Sequence) -> str:
        """Detokenizes the sequence's newest token into seq.output_text; returns the delta."""
        params = seq.request.params
        if self.tokenizer is None or not params.detokenize:
            return ""
        if seq.detokenizer is None:
            seq.detokenizer = self.tokenizer.detokenizer(
                seq.token_ids[: seq.num_prompt_tokens], params.skip_special_tokens)
            for t in seq.token_ids[seq.num_prompt_tokens:-1]:  # a fork's earlier tokens
                seq.output_text += seq.detokenizer.add(t)
        clock = self.clock
        t0 = perf_counter_ns() if clock is not None else 0
        delta = seq.detokenizer.add(seq.token_ids[-1])
        seq.output_text += delta
        if clock is not None:
            clock.add(t0)
        return delta

    def check(self, seq: Sequence, delta: str) -> Optional[str]:
        """Returns the finish reason ("stop" / "length") once seq is done, else None.

        Sets seq.stop_reason and trims seq.output_text when a stop string matched.
        """
        params = seq.request.params
        token_ids = seq.token_ids
        token = token_ids[-1]
        n_out = len(token_ids) - seq.num_prompt_tokens  # seq.num_output_tokens
        if n_out >= params.min_tokens:
            eos = not params.ignore_eos and token in self.eos_token_ids
            if eos or token in params.stop_token_ids:
                # The text of the EOS or stop token (EOS's shows with skip_special_tokens=False)
                # is not part of the completion unless include_stop_str_in_output, as in vLLM.
                if delta and not params.include_stop_str_in_output \
                        and seq.output_text.endswith(delta):
                    seq.output_text = seq.output_text[:-len(delta)]
                if not eos:
                    seq.stop_reason = token
                return "stop"
            if params.stop and delta:
                hit = self._find_stop(seq, delta, params.stop, params.include_stop_str_in_output)
                if hit is not None:
                    seq.stop_reason = hit
                    return "stop"
        if params.max_tokens is not None and n_out >= params.max_tokens:
            return "length"
        if seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    @staticmethod
    def _find_stop(seq: Sequence, delta: str, stops, include: bool) -> Optional[str]:
        text = seq.output_text
        for stop in stops:
            # Only look where the new text could complete a match.
            begin = max(0, len(text) - len(delta) - len(stop) + 1)
            at = text.find(stop, begin)
            if at != -1:
                seq.output_text = text[: at + len(stop)] if include else text[:at]
                return stop
        return None

    def finish_text(self, seq: Sequence) -> None:
        """Appends the text the detokenizer still holds back, unless a stop string cut it."""
        if seq.detokenizer is not None and not isinstance(seq.stop_reason, str):
            seq.output_text += seq.detokenizer.flush()
