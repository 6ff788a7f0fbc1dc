"""Request bodies of the OpenAI-compatible API (pydantic), with vLLM's extensions.

- Every numeric field is range-checked here (finite floats, integers that fit the engine), so a
  bad value is a 400 naming the field before anything reaches the engine.
- An explicit ``null`` means "unset" for every optional field, as OpenAI's client and vLLM
  read it: the field takes its default.
- A string anywhere in the body with a lone UTF-16 surrogate ("\\ud800", which JSON allows but
  UTF-8 cannot encode) is a 400 naming where it is.
- Unknown fields are ignored with a warning (see ``extra_fields``); OpenAI fields this server
  does not implement are an error when set to anything but their neutral value, and a few
  purely informational ones (``user``, ``metadata``, ...) are accepted silently.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Annotated

from pagedllm.sampling_params import MAX_INT32, MAX_SEED
from pagedllm.server.errors import bad_request
from pagedllm.server.text_checks import check_strings

# Accepted and ignored: they do not change what is generated.
IGNORED_FIELDS = frozenset({
    "user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
    "parallel_tool_calls", "verbosity", "priority", "request_id",
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
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "lora_request": (None,),
}

MAX_STOP_SEQUENCES = 16
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20  # vLLM's default max_logprobs; OpenAI's top_logprobs cap

Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]


class _Body(BaseModel):
    """A request body: nulls dropped (unset), lone surrogates refused."""

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_unset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_strings(data)
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(_Body):
    """Options of a streamed answer.

    Args:
        include_usage: end with a chunk carrying the usage (OpenAI).
        continuous_usage_stats: carry the usage so far on every chunk (vLLM).
        include_obfuscation: OpenAI's padding of chunks against side channels; accepted, and
            nothing is padded (the server runs where clients reach it directly).
        Other options are ignored.
    """

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: bool = True


class _SamplingRequest(_Body):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1, le=MAX_INT32)
    temperature: Finite = Field(1.0, ge=0.0, le=2.0)
    top_p: Finite = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, List[str]]] = None
    seed: Optional[int] = Field(None, ge=0, le=MAX_SEED)
    presence_penalty: Finite = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: Finite = Field(0.0, ge=-2.0, le=2.0)
    # vLLM extensions.
    top_k: int = Field(-1, ge=-1, le=MAX_INT32)
    min_p: Finite = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: Finite = Field(1.0, gt=0.0, le=100.0)
    min_tokens: int = Field(0, ge=0, le=MAX_INT32)
    ignore_eos: bool = False
    stop_token_ids: Optional[List[TokenId]] = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1, le=MAX_INT32)
    return_tokens_as_token_ids: bool = False
    cache_salt: Optional[str] = Field(None, min_length=1, max_length=1024)
    use_beam_search: bool = False
    length_penalty: Finite = 1.0
    # pagedllm extension: block-sparse decode attention (keys of SparseAttentionConfig).
    sparse_attention: Optional[Dict[str, Any]] = None

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
        """True when the stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """True when every chunk carries the usage so far (vLLM's continuous_usage_stats)."""
        return bool(self.stream_options and self.stream_options.include_usage
                    and self.stream_options.continuous_usage_stats)


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions.

    ``prompt`` is a string, a list of strings, a list of token ids or a list of such lists;
    each prompt gives ``n`` choices, numbered prompt_index * n + j. ``max_tokens: 0`` is
    allowed with ``echo`` (score the prompt, generate nothing).
    """

    prompt: Union[str, List[str], List[TokenId], List[List[TokenId]]]
    max_tokens: Optional[int] = Field(16, ge=0, le=MAX_INT32)
    best_of: Optional[int] = Field(None, ge=1, le=128)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    add_special_tokens: bool = True


class ContentPart(_Body):
    """One part of a message's content: text, or image_url (multimodal models)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None
    image_url: Optional[Dict[str, Any]] = None


class ChatMessage(_Body):
    """One message of a conversation."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[ContentPart]]] = None
    name: Optional[str] = None

    def text(self, index: int, image_text: Optional[str] = None) -> str:
        """The content as plain text (text parts joined; image_url parts as `image_text`
        when given, the model's image placeholder)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type == "image_url" and image_text is not None:
                parts.append(image_text)
                continue
            if part.type != "text" or part.text is None:
                raise bad_request(f"messages[{index}].content: only text parts are supported, "
                                  f"got a part of type {part.type!r}", f"messages.{index}.content")
            parts.append(part.text)
        return "".join(parts)


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions."""

    messages: List[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=MAX_INT32)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    # vLLM extensions.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: Optional[bool] = None  # None: add bos unless the template wrote it
    chat_template_kwargs: Optional[Dict[str, Any]] = None


class TokenizeRequest(_Body):
    """POST /tokenize: a text prompt, or chat messages rendered with the chat template."""

    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[List[ChatMessage]] = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[Dict[str, Any]] = None


class DetokenizeRequest(_Body):
    """POST /detokenize."""

    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    tokens: List[int]


def extra_fields(request: BaseModel, strict: bool = False) -> List[str]:
    """The unknown fields of a request, which the server ignores.

    Args:
        request: a parsed body (``model_extra`` holds what the model does not define).
        strict: refuse unknown fields instead of ignoring them.
    Returns:
        The ignored unknown field names (informational fields such as ``user`` excluded).
    Raises:
        OpenAIError: 400 for an unsupported OpenAI feature set to a non-neutral value, or for
            any unknown field when `strict`.
    """
    ignored = []
    for name, value in (request.model_extra or {}).items():
        if name in IGNORED_FIELDS:
            continue
        if name in NEUTRAL_VALUES:
            if value in NEUTRAL_VALUES[name]:
                continue
            raise bad_request(f"{name} is not supported by this server", name)
        if strict:
            raise bad_request(f"unknown field {name!r} (the server runs with strict fields)",
                              name)
        ignored.append(name)
    return ignored


def is_token_prompt(prompt: Any) -> bool:
    """True for a prompt given as token ids (a list of ints or of int lists)."""
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)
