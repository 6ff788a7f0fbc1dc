"""The FastAPI app of the OpenAI-compatible server.

    engine = LLMEngine(EngineConfig(model="path/to/llama"))
    app = create_app(engine, ServerSettings(api_key="secret"))
    uvicorn.run(app, host="127.0.0.1", port=8000)

The app owns an AsyncLLMEngine around the given engine: its thread starts with the app
(lifespan startup) and stops with it, aborting what still runs. With
ServerSettings.allowed_origins, Starlette's CORSMiddleware answers browsers' preflights.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, Optional

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from pagedllm._version import __version__
from pagedllm.engine.async_engine import AsyncLLMEngine
from pagedllm.metrics import EngineMetrics
from pagedllm.server.errors import install_error_handlers
from pagedllm.server.ignored_fields import HEADER as IGNORED_HEADER
from pagedllm.server.lifecycle import ServerLimits
from pagedllm.server.limits import BodySizeLimitMiddleware
from pagedllm.server.routes import make_routers
from pagedllm.server.state import ServerSettings, ServerState, model_name_of


def create_app(engine: Any, settings: Optional[ServerSettings] = None,
               limits: Optional[ServerLimits] = None) -> FastAPI:
    """Builds the server around a synchronous engine.

    Args:
        engine: an LLMEngine (the app's engine thread becomes its only user).
        settings: HTTP options (default ServerSettings()).
        limits: connection protections (default ServerLimits()); the app applies the body
            timeout, the rest is lifecycle.PagedServer's.
    Returns:
        The ASGI app; ``app.state.server`` holds the ServerState (engine, metrics, ...).
    Raises:
        ChatTemplateError: the chat template cannot be loaded.
    """
    settings = settings or ServerSettings()
    name = settings.served_model_name or model_name_of(engine.model_path)
    async_engine = AsyncLLMEngine(engine)
    metrics = EngineMetrics(async_engine.stats, name)
    async_engine.on_outputs = metrics.on_outputs  # set before the thread starts
    async_engine.on_abort = metrics.on_abort
    state = ServerState(async_engine, metrics, settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        async_engine.start()
        try:
            yield
        finally:
            async_engine.shutdown()

    app = FastAPI(title="pagedllm", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible API of a pagedllm engine.")
    app.state.server = state
    install_error_handlers(app)
    v1, misc = make_routers(settings.api_key, settings.metrics_public)
    app.include_router(v1)
    app.include_router(misc)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_request_bytes,
                       body_timeout=(limits or ServerLimits()).body_timeout)
    if settings.allowed_origins:  # outermost: preflights are answered before anything else
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["*"], expose_headers=[IGNORED_HEADER],
                           allow_credentials=False, max_age=600)
    return app
