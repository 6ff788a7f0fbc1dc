"""The OpenAI-compatible HTTP server (FastAPI + uvicorn): create_app(engine, settings)."""

from pagedllm.server.app import create_app
from pagedllm.server.state import ServerSettings

__all__ = ["create_app", "ServerSettings"]
