"""Tokenizer: a Hugging Face tokenizer.json through the `tokenizers` library, plus the special
token ids a Llama checkpoint declares and an incremental detokenizer for streaming.

Special ids come from, in order of precedence: tokenizer_config.json (`bos_token`,
`eos_token`, `add_bos_token`), generation_config.json and config.json (`bos_token_id`,
`eos_token_id`). The eos ids are the union of all of them (Llama 3 instruct models stop on
several ids), first-found first.

Checked when loading (CheckpointError, a ValueError, naming the file): every file is a regular
file (a FIFO named tokenizer.json is refused, never waited on); the tokenizer's ids fit the
model's vocabulary (config.json's vocab_size may be padded above the tokenizer's, as
transformers' checkpoints often are, but a tokenizer with more ids than the model has rows
would index past the embedding); and the bos/eos ids are inside that vocabulary.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Sequence

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.decoders import DecodeStream

from pagedllm.model.errors import CheckpointError
from pagedllm.model.files import read_json, read_regular_bytes

# Prompt tokens the detokenizer is primed with (vLLM's bounds): the shortest suffix of
# PRIME_MIN_TOKENS..PRIME_MAX_TOKENS - 1 tokens that decodes to whole characters, so that the
# decoder sees the word boundary before the first generated token.
PRIME_MIN_TOKENS = 4
PRIME_MAX_TOKENS = 24


class Tokenizer:
    """Encode/decode text and know the special ids of one checkpoint.

    Args:
        tokenizer: a `tokenizers.Tokenizer`.
        bos_token_id: id prepended to prompts (None: the model has none).
        eos_token_ids: ids that end generation.
        add_bos_token: prepend bos when the tokenizer's own post-processor does not.
    """

    def __init__(self, tokenizer: _HFTokenizer, bos_token_id: Optional[int] = None,
                 eos_token_ids: Sequence[int] = (), add_bos_token: bool = False) -> None:
        self._tk = tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        probe = tokenizer.encode("a", add_special_tokens=True).ids
        self._prepend_bos = (add_bos_token and bos_token_id is not None
                             and (not probe or probe[0] != bos_token_id))

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "Tokenizer":
        """Reads tokenizer.json (required) and the optional tokenizer_config.json,
        generation_config.json and config.json of a checkpoint directory.

        Raises:
            FileNotFoundError: no tokenizer.json in `path`.
            CheckpointError (a ValueError): a file that is not regular or cannot be parsed, a
                tokenizer larger than config.json's vocab_size, or a bos/eos id outside it (the
                message names the file).
        """
        tk_path = os.path.join(path, "tokenizer.json")
        if not os.path.lexists(tk_path):
            raise FileNotFoundError(f"{tk_path}: not found (prompts can be given as token ids)")
        data = read_regular_bytes(tk_path)
        try:
            tk = _HFTokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise CheckpointError(f"{tk_path}: not a valid tokenizer.json ({e})") from None
        tok_cfg = _optional_json(os.path.join(path, "tokenizer_config.json"))
        gen_cfg = _optional_json(os.path.join(path, "generation_config.json"))
        model_cfg = _optional_json(os.path.join(path, "config.json"))
        if isinstance(model_cfg.get("text_config"), dict):  # LLaVA: the decoder's vocabulary
            model_cfg = {**model_cfg["text_config"],
                         **{k: v for k, v in model_cfg.items() if k != "text_config"}}
            vocab = model_cfg.get("vocab_size")
            if model_cfg.get("model_type") == "mllama" and isinstance(vocab, int):
                model_cfg["vocab_size"] = vocab + 8  # its embedding's rows: <|image|> is past

        eos: list[int] = []
        eos_tok = _token_id(tk, tok_cfg.get("eos_token"))
        for value in (eos_tok, gen_cfg.get("eos_token_id"), model_cfg.get("eos_token_id")):
            eos.extend(_ids(value))
        bos = _token_id(tk, tok_cfg.get("bos_token"))
        if bos is None:
            bos_ids = _ids(gen_cfg.get("bos_token_id", model_cfg.get("bos_token_id")))
            bos = bos_ids[0] if bos_ids else None
        _check_fits_model(tk, tk_path, bos, eos, model_cfg, os.path.join(path, "config.json"))
        return cls(tk, bos, eos, bool(tok_cfg.get("add_bos_token", False)))

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary, added tokens included."""
        return self._tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (with bos when add_special_tokens and the model uses one)."""
        ids = self._tk.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._prepend_bos:
            ids = [self.bos_token_id] + ids  # type: ignore[list-item]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`."""
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        """Id of a token string, or None."""
        return self._tk.token_to_id(token)

    def detokenizer(self, prompt_ids: Sequence[int] = (),
                    skip_special_tokens: bool = True) -> "IncrementalDetokenizer":
        """A streaming detokenizer for text generated after `prompt_ids`."""
        return IncrementalDetokenizer(self, prompt_ids, skip_special_tokens)


class IncrementalDetokenizer:
    """Turns generated ids into text deltas, one token at a time, emitting only whole characters.

    The tokenizers library's DecodeStream (vLLM's V1 detokenizer does the same) keeps the ids
    since its last emission and emits once they decode to whole characters, byte-fallback
    pieces (Llama 2's <0xE4>) and byte-level BPE alike. It is primed with the end of the prompt
    so that the first generated token's word-boundary space is right: the shortest suffix of 4
    to 23 tokens that decodes without U+FFFD, else (the prompt ends inside a character, or a run
    of byte pieces) the whole prompt, whose unfinished character the output then completes and
    emits. (The scheme before, decoding windows of the ids twice per token and comparing
    lengths, turned generated CJK text into U+FFFD after a byte-fallback prompt and dropped the
    character a prompt ending mid-character left open.) Concatenating every add() result and
    flush() gives the generated text.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (),
                 skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._pending: list[int] = []  # ids since the last emission
        self.text = ""  # everything emitted so far
        prompt = list(prompt_ids)
        prime = prompt
        for n in range(PRIME_MIN_TOKENS, min(len(prompt), PRIME_MAX_TOKENS) + 1):
            if "\ufffd" not in tokenizer.decode(prompt[-n:], skip_special_tokens):
                prime = prompt[-n:]
                break
        for t in prime:
            self._step(t)
        self._pending = []

    def _step(self, token_id: int) -> Optional[str]:
        try:
            return self._stream.step(self._tok._tk, token_id)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
            # An id outside the tokenizer (a padded vocabulary) or a decoder whose output
            # stopped being a prefix of itself: start a new stream at this token (vLLM's
            # recovery), the text so far stays emitted.
            self._stream = DecodeStream(skip_special_tokens=self._skip)
            try:
                return self._stream.step(self._tok._tk, token_id)
            except Exception:  # noqa: BLE001 - not a token of this tokenizer: no text
                self._stream = DecodeStream(skip_special_tokens=self._skip)
                return None

    def add(self, token_id: int) -> str:
        """Appends one generated id; returns the newly completed text ("" if none yet)."""
        self._pending.append(token_id)
        delta = self._step(token_id)
        if not delta:
            return ""
        self._pending = []
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back at the end of generation (an unfinished character:
        U+FFFD per byte, as decode() shows it)."""
        delta = self._tok.decode(self._pending, self._skip) if self._pending else ""
        self._pending = []
        self.text += delta
        return delta


def _optional_json(path: str) -> dict[str, Any]:
    return read_json(path) if os.path.lexists(path) else {}


def _check_fits_model(tk: _HFTokenizer, tk_path: str, bos: Optional[int], eos: Sequence[int],
                      model_cfg: dict[str, Any], cfg_path: str) -> None:
    """Refuses a tokenizer whose ids, or bos/eos ids, do not fit config.json's vocab_size."""
    vocab = model_cfg.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        return  # no model config here (a bare tokenizer directory): nothing to check against
    ids = tk.get_vocab(with_added_tokens=True).values()
    needed = max(ids, default=-1) + 1
    if needed > vocab:
        raise CheckpointError(
            f"{tk_path}: the tokenizer has token ids up to {needed - 1}, but {cfg_path} has "
            f"vocab_size = {vocab}: expected every token id below vocab_size (a tokenizer for "
            f"another model?)")
    for name, tid in [("bos", bos)] + [("eos", e) for e in eos]:
        if tid is not None and not 0 <= tid < vocab:
            raise CheckpointError(f"{os.path.dirname(tk_path) or '.'}: the {name} token id {tid} "
                                  f"is outside the model vocabulary [0, {vocab})")


def _token_id(tk: _HFTokenizer, token: Any) -> Optional[int]:
    # tokenizer_config.json writes special tokens as a string or as {"content": ...}.
    if isinstance(token, dict):
        token = token.get("content")
    return tk.token_to_id(token) if isinstance(token, str) else None


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
