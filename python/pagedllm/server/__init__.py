"""The OpenAI-compatible HTTP server (FastAPI + uvicorn): create_app(engine, settings).

The names are loaded on first use, so ``pagedllm.server.cli_args`` can be imported by the CLI
without importing FastAPI.
"""

from typing import TYPE_CHECKING

__all__ = ["create_app", "ServerSettings"]

if TYPE_CHECKING:  # pragma: no cover
    from pagedllm.server.app import create_app
    from pagedllm.server.state import ServerSettings


def __getattr__(name: str):
    if name == "create_app":
        from pagedllm.server.app import create_app

        return create_app
    if name == "ServerSettings":
        from pagedllm.server.state import ServerSettings

        return ServerSettings
    raise AttributeError(f"module 'pagedllm.server' has no attribute {name!r}")
