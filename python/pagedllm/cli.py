"""The ``pagedllm`` command: generate, serve, bench, monitor, info.

Errors a user can meet (a missing model directory, a KV budget too small, a bad flag or config
key) are one line on stderr, ``pagedllm: error: <what> (<what to do>)``, with exit code 2 for
usage errors and 1 for failures while running; ``--verbose`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, NoReturn, Optional

from pagedllm._version import __version__
from pagedllm.commands import bench, generate, info, monitor, serve
from pagedllm.commands.common import CliError, flag_hint

COMMANDS = (generate, serve, bench, monitor, info)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: 'pagedllm: error: ... (see pagedllm CMD --help)'."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"pagedllm: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (each subcommand sets ``args.run``)."""
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="show debug logs, and tracebacks on errors")
    parser = _Parser(prog="pagedllm", parents=[verbose],
                     description="PagedAttention inference for Llama models.")
    parser.add_argument("--version", action="version", version=f"pagedllm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.HELP, description=command.__doc__,
                           parents=[verbose], formatter_class=argparse.RawDescriptionHelpFormatter)
        command.add_arguments(p)
        p.set_defaults(run=command.run, parser=p)
    return parser


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("pagedllm: %(levelname)s: %(message)s"))
    root = logging.getLogger("pagedllm")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    root.propagate = False


def describe_error(e: BaseException) -> tuple:
    """(exit code, one-line message) for an exception that ends a command."""
    if isinstance(e, CliError):
        return e.exit_code, str(e)
    message = " ".join(str(e).split())
    if isinstance(e, FileNotFoundError):
        return 1, message or "file not found"
    if isinstance(e, ValueError):  # the engine's "what is wrong and what to change" messages
        hint = flag_hint(message)
        return 1, message + (f" (flags: {hint})" if hint else "")
    if isinstance(e, OSError):
        return 1, f"{message} (run with --verbose for details)"
    executor = sys.modules.get("pagedllm.engine.executor")
    if executor is not None and isinstance(e, executor.ExecutorDeadError):
        return 1, message  # a tensor-parallel rank died or hung: the message names it
    return 1, (f"unexpected {type(e).__name__}: {message} "
               "(run with --verbose for the traceback, and please report it)")


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line `argv` (default sys.argv[1:]); returns the exit code."""
    try:
        args, extra = build_parser().parse_known_args(argv)
        if extra:  # reported by the subcommand's parser, so the hint names its --help
            args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return e.code if isinstance(e.code, int) else 2
    verbose = getattr(args, "verbose", False)
    _setup_logging(verbose)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("pagedllm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`pagedllm ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:
        if verbose:
            raise
        code, message = describe_error(e)
        print(f"pagedllm: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
