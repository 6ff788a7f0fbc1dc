"""Serve the model over an OpenAI-compatible HTTP API.

Routes: /v1/completions, /v1/chat/completions, /v1/models (behind --api-key when set),
/health, /tokenize, /detokenize, /metrics (Prometheus). Binds 127.0.0.1 unless told otherwise;
the port is taken before the model loads, so a busy port fails at once.

Slow clients are cut off (--timeout-header, --timeout-body: 408 and close) and connections are
capped (--max-connections: 503 and close). SIGTERM or Ctrl-C stops the server: new connections
are refused, running requests get --shutdown-grace seconds to finish, then each one still
running ends with a 503 error (an SSE error event then [DONE] on streams), and the process
exits 0 after "server stopped".

examples:
  pagedllm serve --model ./llama
  PAGEDLLM_API_KEY=secret pagedllm serve --host 0.0.0.0 --port 8000
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "The list type", "max_tokens": 32}'
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from pagedllm.commands import HELPS
from pagedllm.commands.common import (CliError, UsageError, add_engine_args, add_trace_arg,
                                      build_engine, start_trace,
                                      engine_config, parse_size, positive_int)
from pagedllm.server.cli_args import add_policy_arguments, policy_settings

NAME = "serve"
HELP = HELPS[NAME]


def add_arguments(p: argparse.ArgumentParser) -> None:
    h = p.add_argument_group("server")
    h.add_argument("--host", default="127.0.0.1",
                   help="address to bind (127.0.0.1; 0.0.0.0 exposes it to the network)")
    h.add_argument("--port", type=int, default=8000, help="port (8000; 0 picks a free one)")
    h.add_argument("--api-key", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1 routes "
                        "(default: $PAGEDLLM_API_KEY, else no key)")
    h.add_argument("--served-model-name", metavar="NAME",
                   help="model id clients use (default: the checkpoint directory's name)")
    add_trace_arg(h)
    h.add_argument("--chat-template", metavar="FILE",
                   help="Jinja2 chat template replacing the checkpoint's")
    h.add_argument("--max-request-bytes", type=parse_size, default=1 << 20, metavar="SIZE",
                   help="largest request body (1MiB)")
    h.add_argument("--max-tokens-limit", type=positive_int, default=4096, metavar="N",
                   help="largest max_tokens a request may ask for (4096)")
    h.add_argument("--timeout-header", type=_seconds, default=20.0, metavar="S",
                   help="seconds a connection may take to send a request's headers, from when "
                        "it opens or its last response ended (20)")
    h.add_argument("--timeout-body", type=_seconds, default=60.0, metavar="S",
                   help="seconds a request may take to send its body (60)")
    h.add_argument("--max-connections", type=positive_int, default=512, metavar="N",
                   help="open connections at most; more are answered 503 (512)")
    h.add_argument("--shutdown-grace", type=_seconds_or_zero, default=5.0, metavar="S",
                   help="seconds running requests may finish in at shutdown before they end "
                        "with a 503 (5)")
    h.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (info)")
    add_policy_arguments(h)  # CORS, --strict-fields, --metrics-public, cache salting, limits
    add_engine_args(p)


def _seconds(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    value = _seconds_or_zero(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0 seconds, got 0")
    return value


def _seconds_or_zero(text: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when host contains ':')."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {e.strerror or e} "
                       "(choose another --port or --host)") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    config = engine_config(args)
    from pagedllm.server.auth import API_KEY_ENV
    from pagedllm.server.lifecycle import PagedServer, ServerLimits
    from pagedllm.server.state import ServerSettings

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        settings = ServerSettings(api_key=api_key, served_model_name=args.served_model_name,
                                  max_request_bytes=args.max_request_bytes,
                                  max_tokens_limit=args.max_tokens_limit,
                                  chat_template=args.chat_template, **policy_settings(args))
        limits = ServerLimits(header_timeout=args.timeout_header, body_timeout=args.timeout_body,
                              max_connections=args.max_connections,
                              shutdown_grace=args.shutdown_grace)
    except ValueError as e:
        raise UsageError(str(e)) from None
    sock = bind_socket(args.host, args.port)
    from pagedllm.server.app import create_app
    from pagedllm.chat_template import ChatTemplateError

    engine = build_engine(config)
    start_trace(engine, args)
    try:
        app = create_app(engine, settings, limits)
    except ChatTemplateError as e:
        raise UsageError(f"{e} (fix --chat-template or the checkpoint's tokenizer_config.json)") from None
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    auth = "an API key" if api_key else "no API key"
    print(f"pagedllm: serving {app.state.server.model_name!r} on http://{shown}:{port} "
          f"(OpenAI API under /v1, {auth}; Ctrl-C stops)", file=sys.stderr, flush=True)
    server = PagedServer(app, limits, log_level=args.log_level)
    server.run(sockets=[sock])  # returns after a clean stop (SIGTERM, SIGINT)
    if not server.started:
        raise CliError("the server did not start (see uvicorn's log above)")
    why = f" ({signal.Signals(server.stop_signal).name})" if server.stop_signal else ""
    print(f"pagedllm: server stopped{why}", file=sys.stderr, flush=True)
    return 0
