"""Server-sent events, as OpenAI streams them: one ``data: <json>`` event per chunk, then
``data: [DONE]``."""

from __future__ import annotations

from typing import AsyncIterator, Dict, Optional

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

DONE_EVENT = "data: [DONE]\n\n"


def sse_event(payload: BaseModel | str) -> str:
    """One event carrying a model (as JSON) or a preformatted JSON string."""
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


def sse_response(events: AsyncIterator[str],
                 headers: Optional[Dict[str, str]] = None) -> StreamingResponse:
    """A streaming response of text/event-stream events (no caching, no proxy buffering),
    with any extra `headers`."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                      **(headers or {})})
