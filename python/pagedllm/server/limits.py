"""A request-body size limit, as pure ASGI middleware (it counts chunked bodies too)."""

from __future__ import annotations

import json

from pagedllm.server.errors import OpenAIError


class BodySizeLimitMiddleware:
    """Answers 413 in OpenAI's error shape to a request whose body exceeds `max_bytes`.

    The body is read up front (at most max_bytes + one chunk are held), then replayed to the
    app as one message; later receive() calls go to the connection (disconnect detection).

    Args:
        app: the ASGI app to protect.
        max_bytes: the largest accepted body.
    """

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                return await self._reject(send)
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await self._reject(send)
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

    async def _reject(self, send) -> None:
        err = OpenAIError(413, f"request body too large: the limit is {self.max_bytes} bytes "
                          "(raise the server's --max-request-bytes)")
        body = json.dumps(err.body()).encode("utf-8")
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
