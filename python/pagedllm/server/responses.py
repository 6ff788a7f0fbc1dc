"""Response bodies of the OpenAI-compatible API (pydantic), field for field as OpenAI's.

vLLM's extras are included: ``stop_reason`` on choices (the stop string or token id that ended a
choice, null otherwise) and ``prompt_logprobs`` when asked for; OpenAI clients ignore them.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, Field, model_serializer


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "UsageInfo":
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class PromptLogprob(BaseModel):
    """vLLM's Logprob of one token at one prompt position."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


PromptLogprobs = List[Optional[Dict[int, PromptLogprob]]]


# --- /v1/completions ----------------------------------------------------------------------------
class CompletionLogprobs(BaseModel):
    """Per generated token: its text, logprob, top alternatives and offset in the choice text."""

    tokens: List[str] = Field(default_factory=list)
    token_logprobs: List[Optional[float]] = Field(default_factory=list)
    top_logprobs: List[Optional[Dict[str, float]]] = Field(default_factory=list)
    text_offset: List[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    prompt_logprobs: Optional[PromptLogprobs] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[CompletionChoice]
    usage: Optional[UsageInfo] = None


# --- /v1/chat/completions -----------------------------------------------------------------------
class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[List[int]] = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: List[ChatTopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: Optional[List[ChatTokenLogprob]] = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: Optional[PromptLogprobs] = None


class DeltaMessage(BaseModel):
    """A chunk's increment; absent fields are left out of the JSON, as OpenAI does."""

    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None

    @model_serializer
    def _drop_none(self) -> Dict[str, Any]:
        return {k: v for k, v in (("role", self.role), ("content", self.content)) if v is not None}


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[ChatStreamChoice]
    usage: Optional[UsageInfo] = None


# --- models, tokenizer --------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pagedllm"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: List[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: List[int]


class DetokenizeResponse(BaseModel):
    prompt: str
