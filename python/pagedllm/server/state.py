"""What every route needs: the engine, the tokenizer, the served name, limits, the template."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import List, Optional

from pagedllm.engine.async_engine import AsyncLLMEngine
from pagedllm.metrics import EngineMetrics
from pagedllm.server.chat_template import ChatTemplate
from pagedllm.server.errors import OpenAIError, bad_request


# Request fields whose default comes from the checkpoint's generation_config.json when set there.
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass
class ServerSettings:
    """Options of the HTTP layer (the engine's are in EngineConfig).

    Args:
        api_key: when set, every /v1 route needs ``Authorization: Bearer <api_key>``.
        served_model_name: the model id clients use (default: the checkpoint directory's name).
        max_request_bytes: largest request body accepted (413 above).
        max_tokens_limit: largest max_tokens a request may ask for (400 above); also the
            default for chat requests without max_tokens (capped by the context left).
        chat_template: a Jinja2 file that replaces the checkpoint's chat template.
    """

    api_key: Optional[str] = None
    served_model_name: Optional[str] = None
    max_request_bytes: int = 1 << 20
    max_tokens_limit: int = 4096
    chat_template: Optional[str] = None

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        if self.max_tokens_limit < 1:
            raise ValueError(f"max_tokens_limit must be >= 1, got {self.max_tokens_limit}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (omit it to serve without a key)")


class ServerState:
    """Shared by the routes of one app.

    Args:
        engine: the running AsyncLLMEngine (its .engine is the synchronous LLMEngine).
        metrics: the app's metrics.
        settings: the HTTP options.
    """

    def __init__(self, engine: AsyncLLMEngine, metrics: EngineMetrics, settings: ServerSettings):
        sync = engine.engine
        self.engine = engine
        self.metrics = metrics
        self.settings = settings
        self.tokenizer = sync.tokenizer
        self.model_path: str = sync.model_path
        self.model_name = settings.served_model_name or model_name_of(self.model_path)
        self.max_model_len: int = sync.max_model_len
        self.chat_template = ChatTemplate.for_model(self.model_path, settings.chat_template)
        self.created = int(time.time())
        # Sampling knobs a request leaves unset come from generation_config.json (as in vLLM).
        defaults = getattr(sync, "generation_defaults", dict)()
        self.sampling_defaults = {k: v for k, v in defaults.items() if k in SAMPLING_DEFAULT_KEYS}

    def check_model(self, name: Optional[str]) -> None:
        """404 unless `name` is the served model (or omitted)."""
        if name is not None and name != self.model_name:
            raise OpenAIError(404, f"the model {name!r} does not exist here: this server "
                              f"serves {self.model_name!r} (see /v1/models)", "model",
                              "model_not_found")

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of a text prompt (400 when the checkpoint has no tokenizer)."""
        if self.tokenizer is None:
            raise bad_request(f"the model {self.model_name!r} has no tokenizer.json: give the "
                              "prompt as token ids", "prompt")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def max_tokens(self, requested: Optional[int], prompt_len: int, param: str = "max_tokens",
                   prompt_param: str = "messages") -> int:
        """The max_tokens to run with: the request's (checked against the limit), or, when
        absent, what is left of the context capped by the limit.

        Args:
            requested: the request's max_tokens (None: absent).
            prompt_len: tokens of the longest prompt.
            param: the field that carried `requested` (named in errors).
            prompt_param: the field that carried the prompt (named in errors).
        """
        limit = self.settings.max_tokens_limit
        if requested is not None:
            if requested > limit:
                raise bad_request(f"{param} must be at most {limit} on this server, got "
                                  f"{requested}", param)
            return requested
        left = self.max_model_len - prompt_len
        if left < 1:
            raise bad_request(f"the prompt ({prompt_len} tokens) leaves no room to generate: "
                              f"max_model_len is {self.max_model_len}", prompt_param)
        return min(limit, left)


def model_name_of(path: str) -> str:
    """The default served name of a checkpoint directory: its base name."""
    return os.path.basename(os.path.normpath(path)) or path


def new_id(prefix: str) -> str:
    """A fresh request id such as 'cmpl-3f2a...'."""
    return f"{prefix}-{uuid.uuid4().hex}"
