"""The HTTP routes. /v1/* follow OpenAI's API (and need the API key when one is set);
/health, /ping, /version, /tokenize, /detokenize, /tokenizer_info and /metrics are vLLM's
companions (/metrics needs the key too unless ServerSettings.metrics_public)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from pagedllm._version import __version__
from pagedllm.server.auth import require_api_key
from pagedllm.server.errors import OpenAIError, bad_request
from pagedllm.server.generation import now
from pagedllm.server.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                      TokenizeRequest)
from pagedllm.server.responses import DetokenizeResponse, ModelCard, ModelList, TokenizeResponse
from pagedllm.server.serving_chat import create_chat_completion, render_chat
from pagedllm.server.serving_completions import create_completion
from pagedllm.server.state import ServerState


def _state(request: Request) -> ServerState:
    return request.app.state.server


def make_routers(api_key, metrics_public: bool = False) -> tuple:
    """The routers of the app.

    Args:
        api_key: the key /v1 (and /metrics) need, or None.
        metrics_public: serve /metrics without the key.
    Returns:
        (the /v1 router behind the API key, the router of the other routes).
    """
    guard = Depends(require_api_key(api_key))
    v1 = APIRouter(prefix="/v1", dependencies=[guard])
    misc = APIRouter()

    @v1.get("/models", response_model=ModelList)
    async def list_models(request: Request) -> ModelList:
        s = _state(request)
        # root is the served name, never the checkpoint's path on the server's disk.
        return ModelList(data=[ModelCard(id=s.model_name, created=s.created, root=s.model_name,
                                         max_model_len=s.max_model_len)])

    @v1.post("/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival = now()
        return await create_completion(_state(request), body, request, arrival)

    @v1.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        arrival = now()
        return await create_chat_completion(_state(request), body, request, arrival)

    @misc.head("/health", include_in_schema=False)  # load balancers probe with HEAD
    @misc.get("/health")
    async def health(request: Request) -> Response:
        engine = _state(request).engine
        if engine.dead_error is not None:
            raise OpenAIError(503, f"the engine stopped: {engine.dead_error!r}")
        return Response(status_code=200)

    @misc.head("/ping", include_in_schema=False)
    @misc.get("/ping")
    async def ping(request: Request) -> Response:
        """vLLM's (SageMaker's) liveness probe: the same answer as /health."""
        return await health(request)

    @misc.post("/ping")
    async def ping_post(request: Request) -> Response:
        return await health(request)

    @misc.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @misc.get("/tokenizer_info")
    async def tokenizer_info(request: Request) -> dict:
        return _state(request).tokenizer_info()

    @misc.post("/tokenize", response_model=TokenizeResponse)
    async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
        s = _state(request)
        s.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of 'prompt' and 'messages'", "prompt")
        if body.messages is not None:
            ids = render_chat(s, body.messages, body.add_generation_prompt,
                              body.continue_final_message, None,
                              body.chat_template_kwargs).token_ids
        else:
            ids = s.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        return TokenizeResponse(count=len(ids), max_model_len=s.max_model_len, tokens=ids)

    @misc.post("/detokenize", response_model=DetokenizeResponse)
    async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        s = _state(request)
        s.check_model(body.model)
        if s.tokenizer is None:
            raise bad_request(f"the model {s.model_name!r} has no tokenizer.json", "tokens")
        vocab = s.tokenizer.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "tokens")
        return DetokenizeResponse(prompt=s.tokenizer.decode(body.tokens))

    @misc.get("/metrics", dependencies=[] if metrics_public else [guard])
    async def metrics(request: Request) -> Response:
        m = _state(request).metrics
        return Response(m.render(), media_type=m.content_type)

    return v1, misc
