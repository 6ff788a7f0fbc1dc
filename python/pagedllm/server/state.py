"""What every route needs: the engine, the tokenizer, the served name, limits, the template."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

from pagedllm.engine.async_engine import AsyncLLMEngine
from pagedllm.metrics import EngineMetrics
from pagedllm.chat_template import ChatTemplate
from pagedllm.server.errors import OpenAIError, bad_request


# Request fields whose default comes from the checkpoint's generation_config.json when set there.
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Prompt text (characters) past which tokenizing (and rendering a chat) runs on a worker thread
# instead of the event loop: a 1 MiB prompt took 0.34 s, and /health and every stream waited.
OFF_LOOP_CHARS = 32 * 1024

_T = TypeVar("_T")


async def off_loop_if_large(size: int, fn: Callable[..., _T], *args: Any) -> _T:
    """fn(*args), on a worker thread when `size` (characters of prompt text) is at least
    OFF_LOOP_CHARS, else inline (a thread hop costs more than a short prompt's tokenizing).

    Args:
        size: the text's length in characters.
        fn: the function (tokenizing, chat rendering); its exceptions propagate.
    Returns:
        fn's result.
    """
    if size >= OFF_LOOP_CHARS:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


@dataclass
class ServerSettings:
    """Options of the HTTP layer (the engine's are in EngineConfig).

    Args:
        api_key: when set, every /v1 route (and /metrics unless metrics_public) needs
            ``Authorization: Bearer <api_key>``.
        served_model_name: the model id clients use (default: the checkpoint directory's name).
        max_request_bytes: largest request body accepted (413 above).
        max_tokens_limit: largest max_tokens a request may ask for (400 above); also the
            default for chat requests without max_tokens (capped by the context left).
        chat_template: a Jinja2 file that replaces the checkpoint's chat template.
        strict_fields: refuse unknown request fields with a 400 (default: ignore them, log a
            warning and name them in the ``X-Ignored-Fields`` response header, as vLLM does).
        allowed_origins: origins browsers may call the API from (CORS); "*" allows any.
            Empty (the default) sends no CORS headers.
        metrics_public: serve /metrics without the API key (default: behind it, since the
            prefix-cache counters tell one client about another's prompts).
        cache_salt_by_api_key: give every bearer token its own prefix-cache namespace, so
            clients with different keys never share cached blocks (combined with a
            request's own cache_salt).
        max_prompts_per_request: most prompts in one /v1/completions request.
        max_sequences_per_request: most sequences one request may run: prompts x
            max(n, best_of).
        max_logprobs_per_request: most logprob entries one request may ask for: sequences x
            max_tokens x (logprobs + 1), plus prompt tokens x (prompt_logprobs + 1).
        allowed_media_domains: domains whose remote image URLs the operator allows; this
            server still never fetches them (they are refused with a message saying so).
    """

    api_key: Optional[str] = None
    served_model_name: Optional[str] = None
    max_request_bytes: int = 1 << 20
    max_tokens_limit: int = 4096
    chat_template: Optional[str] = None
    strict_fields: bool = False
    allowed_origins: Sequence[str] = ()
    metrics_public: bool = False
    cache_salt_by_api_key: bool = False
    max_prompts_per_request: int = 256
    max_sequences_per_request: int = 256
    max_logprobs_per_request: int = 1 << 20
    allowed_media_domains: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_tokens_limit", "max_prompts_per_request",
                     "max_sequences_per_request", "max_logprobs_per_request"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (omit it to serve without a key)")
        if isinstance(self.allowed_origins, str):
            self.allowed_origins = [o for o in self.allowed_origins.split(",") if o.strip()]
        self.allowed_origins = tuple(o.strip() for o in self.allowed_origins)
        if any(not o for o in self.allowed_origins):
            raise ValueError("allowed_origins must not hold empty origins")


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

    def check_limits(self, num_prompts: int, sequences_per_prompt: int, max_tokens: int,
                     logprobs: Optional[int], prompt_tokens: int,
                     prompt_logprobs: Optional[int]) -> None:
        """Refuses a request that asks for more work than one request may (400 naming the
        field to lower).

        Args:
            num_prompts: prompts in the request.
            sequences_per_prompt: max(n, best_of).
            max_tokens: tokens generated per sequence.
            logprobs: top logprobs per generated token (None: none).
            prompt_tokens: prompt tokens over all prompts.
            prompt_logprobs: top logprobs per prompt token (None: none).
        """
        s = self.settings
        if num_prompts > s.max_prompts_per_request:
            raise bad_request(f"prompt: at most {s.max_prompts_per_request} prompts per request "
                              f"on this server, got {num_prompts}", "prompt")
        sequences = num_prompts * sequences_per_prompt
        if sequences > s.max_sequences_per_request:
            raise bad_request(f"n: prompts x max(n, best_of) = {sequences} sequences exceeds "
                              f"this server's limit of {s.max_sequences_per_request} per request",
                              "n")
        entries = 0
        if logprobs is not None:
            entries += sequences * max_tokens * (logprobs + 1)
        if prompt_logprobs is not None:
            entries += prompt_tokens * (prompt_logprobs + 1)
        if entries > s.max_logprobs_per_request:
            raise bad_request(f"logprobs: the request asks for {entries} logprob entries "
                              f"(sequences x max_tokens x (logprobs + 1) + prompt tokens x "
                              f"(prompt_logprobs + 1)); this server's limit is "
                              f"{s.max_logprobs_per_request}", "logprobs")

    def tokenizer_info(self) -> dict:
        """What /tokenizer_info reports: the special tokens, the vocabulary size, the chat
        template."""
        tk = self.tokenizer
        info = {"model": self.model_name, "max_model_len": self.max_model_len,
                "chat_template": self.chat_template.source,
                "bos_token": self.chat_template.bos_token or None,
                "eos_token": self.chat_template.eos_token or None}
        if tk is not None:
            info.update(tokenizer_class=type(tk).__name__, vocab_size=tk.vocab_size,
                        bos_token_id=getattr(tk, "bos_token_id", None),
                        eos_token_ids=list(getattr(tk, "eos_token_ids", ())))
        return info

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
