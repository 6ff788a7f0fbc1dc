"""Request bodies of the OpenAI-compatible API (pydantic), with vLLM's sampling extensions.

Field ranges follow OpenAI's where OpenAI states one. Unknown fields are an error naming them;
OpenAI fields this server does not implement are an error when set to anything but their
neutral value, and a few purely informational ones (``user``, ``metadata``, ...) are accepted
and ignored. See ``check_extra_fields``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pagedllm.server.errors import bad_request

# Accepted and ignored: they do not change what is generated.
IGNORED_FIELDS = frozenset({
    "user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
    "parallel_tool_calls", "verbosity",
})
# Accepted only with the neutral value given here (None means "absent or null").
NEUTRAL_VALUES: Dict[str, tuple] = {
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}

MAX_STOP_SEQUENCES = 16


class StreamOptions(BaseModel):
    """Options of a streamed answer."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, List[str]]] = None
    seed: Optional[int] = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    # vLLM extensions.
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: Optional[List[int]] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def stop_list(self) -> List[str]:
        """The stop strings as a list (OpenAI allows one string or a list)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise bad_request(f"stop: at most {MAX_STOP_SEQUENCES} sequences are allowed, "
                              f"got {len(stops)}", "stop")
        if any(not s for s in stops):
            raise bad_request("stop: stop sequences must be non-empty strings", "stop")
        return stops

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions.

    ``prompt`` is a string, a list of strings, a list of token ids or a list of such lists;
    each prompt gives ``n`` choices, numbered prompt_index * n + j.
    """

    prompt: Union[str, List[str], List[int], List[List[int]]]
    max_tokens: Optional[int] = Field(16, ge=1)
    best_of: Optional[int] = Field(None, ge=1, le=128)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=20)


class ContentPart(BaseModel):
    """One part of a message's content; only text parts are supported."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[ContentPart]]] = None
    name: Optional[str] = None

    def text(self, index: int) -> str:
        """The content as plain text (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise bad_request(f"messages[{index}].content: only text parts are supported, "
                                  f"got a part of type {part.type!r}", f"messages.{index}.content")
            parts.append(part.text)
        return "".join(parts)


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions."""

    messages: List[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    # vLLM extension: end the rendered prompt with the template's assistant header.
    add_generation_prompt: bool = True


class TokenizeRequest(BaseModel):
    """POST /tokenize: a text prompt, or chat messages rendered with the chat template."""

    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[List[ChatMessage]] = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    tokens: List[int]


def check_extra_fields(request: BaseModel) -> None:
    """Rejects unknown fields and unsupported OpenAI features (400 naming the field)."""
    for name, value in (request.model_extra or {}).items():
        if name in IGNORED_FIELDS:
            continue
        if name in NEUTRAL_VALUES:
            if value in NEUTRAL_VALUES[name]:
                continue
            raise bad_request(f"{name} is not supported by this server", name)
        raise bad_request(f"unknown field {name!r}", name)


def is_token_prompt(prompt: Any) -> bool:
    """True for a prompt given as token ids (a list of ints or of int lists)."""
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)
