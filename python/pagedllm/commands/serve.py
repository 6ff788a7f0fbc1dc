"""Serve the model over an OpenAI-compatible HTTP API.

Routes: /v1/completions, /v1/chat/completions, /v1/models (behind --api-key when set),
/health, /tokenize, /detokenize, /metrics (Prometheus). Binds 127.0.0.1 unless told otherwise;
the port is taken before the model loads, so a busy port fails at once.

examples:
  pagedllm serve --model ./llama
  PAGEDLLM_API_KEY=secret pagedllm serve --host 0.0.0.0 --port 8000
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "The list type", "max_tokens": 32}'
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from pagedllm.commands.common import (CliError, UsageError, add_engine_args, build_engine,
                                      engine_config, parse_size, positive_int)
from pagedllm.server.cli_args import add_policy_arguments, policy_settings

NAME = "serve"
HELP = "start the OpenAI-compatible HTTP server"


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
    h.add_argument("--chat-template", metavar="FILE",
                   help="Jinja2 chat template replacing the checkpoint's")
    h.add_argument("--max-request-bytes", type=parse_size, default=1 << 20, metavar="SIZE",
                   help="largest request body (1MiB)")
    h.add_argument("--max-tokens-limit", type=positive_int, default=4096, metavar="N",
                   help="largest max_tokens a request may ask for (4096)")
    h.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (info)")
    add_policy_arguments(h)  # CORS, --strict-fields, --metrics-public, cache salting, limits
    add_engine_args(p)


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
    from pagedllm.server.state import ServerSettings

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        settings = ServerSettings(api_key=api_key, served_model_name=args.served_model_name,
                                  max_request_bytes=args.max_request_bytes,
                                  max_tokens_limit=args.max_tokens_limit,
                                  chat_template=args.chat_template, **policy_settings(args))
    except ValueError as e:
        raise UsageError(str(e)) from None
    sock = bind_socket(args.host, args.port)
    import uvicorn

    from pagedllm.server.app import create_app
    from pagedllm.server.chat_template import ChatTemplateError

    engine = build_engine(config)
    try:
        app = create_app(engine, settings)
    except ChatTemplateError as e:
        raise UsageError(f"{e} (fix --chat-template or the checkpoint's tokenizer_config.json)") from None
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    auth = "an API key" if api_key else "no API key"
    print(f"pagedllm: serving {app.state.server.model_name!r} on http://{shown}:{port} "
          f"(OpenAI API under /v1, {auth}; Ctrl-C stops)", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, lifespan="on",
                                           timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass
    if not server.started:
        raise CliError("the server did not start (see uvicorn's log above)")
    print("pagedllm: server stopped", file=sys.stderr)
    return 0
