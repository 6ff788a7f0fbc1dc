"""The server's connection lifecycle: slow-client timeouts, a connection cap, and a clean stop.

uvicorn alone leaves three holes (issue 20, defects 7 and 10):

- a client that sends part of its headers, or part of its body, holds a connection forever
  (h11 has no header timeout, and the app waits for the body);
- nothing caps the number of open connections;
- at shutdown, requests still running after the grace period are cancelled: a non-stream
  client gets a text/plain 500, a stream is cut without an error event or ``[DONE]``, and
  SIGTERM is re-raised after the stop, so the process exits 143.

Here: ``guarded_protocol`` wraps uvicorn's HTTP protocol with a header deadline and the cap;
the body deadline is in ``limits.BodySizeLimitMiddleware``; ``PagedServer`` stops in order:
stop accepting, let running requests finish for ``shutdown_grace`` seconds, then shut the
engine down so every request still open ends the normal way (a 503 in OpenAI's error shape,
or an SSE error event followed by ``data: [DONE]``), then stop the app. SIGTERM and SIGINT
both stop the server this way and ``run`` returns normally (the CLI exits 0).

    server = PagedServer(app, ServerLimits(header_timeout=10), log_level="info")
    server.run(sockets=[sock])      # returns after a clean stop; server.stop_signal says why
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional

import uvicorn

from pagedllm.server.errors import OpenAIError

logger = logging.getLogger("pagedllm.server")

# After the engine is shut down, the seconds the open requests get to write their error.
FINISH_S = 5.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class ServerLimits:
    """Connection-level protections of `pagedllm serve`.

    Args:
        header_timeout: seconds a connection may take to send a request's complete headers,
            counted from when it opens or its previous response ended (an idle keep-alive
            connection is closed after this long too). A connection that sent part of its
            headers gets a 408 and is closed; one that sent nothing is closed.
        body_timeout: seconds a request may take to send its complete body once its headers
            are in (408 and close after that).
        max_connections: open connections at most; one more is answered 503 and closed at once.
        shutdown_grace: seconds running requests may finish in after a stop is asked for;
            those still running then end with a 503 error (an SSE error event on streams).
    """

    header_timeout: float = 20.0
    body_timeout: float = 60.0
    max_connections: int = 512
    shutdown_grace: float = 5.0

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
        if not self.shutdown_grace >= 0:
            raise ValueError(f"shutdown_grace must be >= 0 seconds, got {self.shutdown_grace}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


def _raw_error(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI-shaped error body, closing the connection."""
    body = json.dumps(OpenAIError(status, message).body()).encode("utf-8")
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


def guarded_protocol(base: type, header_timeout: float, max_connections: int) -> type:
    """uvicorn's HTTP protocol class `base` with a header deadline and a connection cap.

    Works with h11 and httptools alike: both set ``self.cycle`` to a new request cycle once a
    request's headers are complete, and call ``on_response_complete`` when one ends.

    Args:
        base: uvicorn's protocol class (uvicorn.protocols.http.auto.AutoHTTPProtocol).
        header_timeout: see ServerLimits.
        max_connections: see ServerLimits.
    Returns:
        The subclass, to pass as uvicorn.Config(http=...).
    """
    too_many = _raw_error(503, "Service Unavailable",
                          f"too many connections: this server accepts {max_connections} at once "
                          "(try again later)")
    too_slow = _raw_error(408, "Request Timeout",
                          f"the request headers were not received within {header_timeout:g} s")

    class GuardedHTTPProtocol(base):  # type: ignore[misc, valid-type]
        _refused = False
        _header_timer: Optional[asyncio.TimerHandle] = None
        _partial = False  # bytes arrived since the timer was armed

        def connection_made(self, transport) -> None:  # type: ignore[override]
            if len(self.server_state.connections) >= max_connections:
                self._refused = True
                transport.write(too_many)
                transport.close()
                return
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            self._partial = True
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._refused:
                return
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._partial = False
            self._header_timer = self.loop.call_later(header_timeout, self._headers_due,
                                                      self.cycle)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_due(self, armed_cycle) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not armed_cycle:
                return  # a request's headers came in since
            if armed_cycle is not None and not armed_cycle.response_complete:
                return  # a request is being answered
            if self._partial:
                logger.info("closing a connection that sent incomplete headers for %g s",
                            header_timeout)
                self.transport.write(too_slow)
            self.transport.close()

    GuardedHTTPProtocol.__name__ = f"Guarded{base.__name__}"
    return GuardedHTTPProtocol


class PagedServer(uvicorn.Server):
    """uvicorn.Server with ServerLimits and the shutdown order of the module docstring.

    Args:
        app: the app of create_app (its ``state.server.engine`` is the AsyncLLMEngine).
        limits: the protections (header timeout, connection cap, shutdown grace).
        end_requests: called (in a worker thread) when the grace period is over, to end what
            still runs; default: shut the app's engine down.
        **config: more uvicorn.Config arguments (log_level, ...).
    """

    def __init__(self, app: Any, limits: ServerLimits,
                 end_requests: Optional[Callable[[], None]] = None, **config: Any) -> None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        protocol = guarded_protocol(AutoHTTPProtocol, limits.header_timeout,
                                    limits.max_connections)
        config.setdefault("lifespan", "on")
        super().__init__(uvicorn.Config(app, http=protocol,
                                        timeout_graceful_shutdown=limits.shutdown_grace,
                                        **config))
        self.limits = limits
        self.stop_signal: Optional[int] = None
        self._end_requests = end_requests or (lambda: app.state.server.engine.shutdown(30))

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """SIGINT and SIGTERM ask for a clean stop (a second SIGINT forces it); unlike
        uvicorn's, the signal is not raised again afterwards, so the process exits normally."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = sig
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    async def shutdown(self, sockets: Optional[list] = None) -> None:
        """Stops accepting, waits out the grace period, ends what still runs, stops the app."""
        logger.info("Shutting down")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their response
        grace = self.limits.shutdown_grace
        if not await self._drained(grace):
            logger.warning("%d request(s) still running after the %g s shutdown grace period: "
                           "ending them with 503", len(self.server_state.tasks), grace)
            try:
                await asyncio.to_thread(self._end_requests)
            except Exception:
                logger.exception("ending the running requests failed")
            if not await self._drained(FINISH_S):
                logger.error("cancelling %d request(s) that did not end",
                             len(self.server_state.tasks))
                for task in self.server_state.tasks:
                    task.cancel()
                await self._drained(1.0)
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _drained(self, timeout: float) -> bool:
        """Waits up to `timeout` s for every connection and request to end; True if they did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        state = self.server_state
        while (state.connections or state.tasks) and not self.force_exit:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True
