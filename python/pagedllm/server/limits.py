"""A request-body size limit and deadline, as pure ASGI middleware (it counts chunked bodies
too)."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

from pagedllm.server.errors import OpenAIError


class BodySizeLimitMiddleware:
    """Answers 413 in OpenAI's error shape to a request whose body exceeds `max_bytes`, and
    408 (closing the connection) to one whose body is not complete within `body_timeout`.

    The body is read up front (at most max_bytes + one chunk are held), then replayed to the
    app as one message; later receive() calls go to the connection (disconnect detection).

    Args:
        app: the ASGI app to protect.
        max_bytes: the largest accepted body.
        body_timeout: seconds the whole body may take to arrive (None: no limit).
    """

    def __init__(self, app, max_bytes: int, body_timeout: Optional[float] = None):
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                return await self._reject(send, self._too_large())
        chunks = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = None if self.body_timeout is None else loop.time() + self.body_timeout
        while True:
            try:
                message = await asyncio.wait_for(
                    receive(), None if deadline is None else max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                return await self._reject(send, OpenAIError(
                    408, f"the request body was not received within {self.body_timeout:g} s"))
            if message["type"] != "http.request":  # the client left before sending it all
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await self._reject(send, self._too_large())
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self) -> OpenAIError:
        return OpenAIError(413, f"request body too large: the limit is {self.max_bytes} bytes "
                           "(raise the server's --max-request-bytes)")

    async def _reject(self, send, err: OpenAIError) -> None:
        body = json.dumps(err.body()).encode("utf-8")
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        if err.status == 408:  # the rest of the body may still come: no reuse of the connection
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
