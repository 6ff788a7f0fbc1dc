"""The ``pagedllm`` command: generate, serve, bench, monitor, info.

Errors a user can meet (a missing model directory, a KV budget too small, a bad flag or config
key) are one line on stderr, ``pagedllm: error: <what> (<what to do>)``, with exit code 2 for
usage errors and 1 for failures while running; ``--verbose`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from typing import Iterable, List, NoReturn, Optional, Sequence

from pagedllm._version import __version__
from pagedllm.commands import HELPS, load
from pagedllm.commands.errors import CliError

# The command modules (and through them torch) are imported only when their command runs:
# `pagedllm --help` stays fast, and a Ctrl-C during the imports is an interrupt like any other.
COMMANDS = tuple(HELPS)
# Commands that load torch (after their flags parsed: --help and usage errors stay fast).
_ENGINE_COMMANDS = ("generate", "serve", "bench", "info")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: 'pagedllm: error: ... (see pagedllm CMD --help)'."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"pagedllm: error: {message} (see '{self.prog} --help')\n")


def build_parser(commands: Optional[Iterable[str]] = None) -> argparse.ArgumentParser:
    """The parser of the command line (each subcommand sets ``args.run``).

    Args:
        commands: the commands whose modules are imported and whose flags are added (None:
            all of them); the others are listed by --help but cannot parse arguments.
    """
    wanted = set(COMMANDS if commands is None else commands)
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="show debug logs, and tracebacks on errors")
    parser = _Parser(prog="pagedllm", parents=[verbose],
                     description="PagedAttention inference for Llama models.")
    parser.add_argument("--version", action="version", version=f"pagedllm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, help_text in HELPS.items():
        if name not in wanted:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        command = load(name)
        p = sub.add_parser(name, help=help_text, description=command.__doc__,
                           parents=[verbose], formatter_class=argparse.RawDescriptionHelpFormatter)
        command.add_arguments(p)
        p.set_defaults(run=command.run, parser=p)
    return parser


def command_of(argv: Sequence[str]) -> Optional[str]:
    """The command `argv` names (its first word after the global options), if it is one."""
    for i, arg in enumerate(argv):
        if arg == "--":
            arg = argv[i + 1] if i + 1 < len(argv) else ""
        elif arg.startswith("-"):
            continue  # -v, --verbose, --version, -h: none of them takes a value
        return arg if arg in HELPS else None
    return None


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
        common = sys.modules.get("pagedllm.commands.common")  # loaded by the engine commands
        hint = common.flag_hint(message) if common is not None else None
        return 1, message + (f" (flags: {hint})" if hint else "")
    if isinstance(e, OSError):
        return 1, f"{message} (run with --verbose for details)"
    executor = sys.modules.get("pagedllm.engine.executor")
    if executor is not None and isinstance(e, executor.ExecutorDeadError):
        return 1, message  # a tensor-parallel rank died or hung: the message names it
    return 1, (f"unexpected {type(e).__name__}: {message} "
               "(run with --verbose for the traceback, and please report it)")


class _NotedInterrupts:
    """SIGINT while a command runs, noted so that nothing on the way can hide it.

    While the command's modules import (`deferred`), a first Ctrl-C is only noted and acted on
    once they are in: a KeyboardInterrupt raised inside numpy's or torch's imports can be
    swallowed by them (leaving a half-imported module that fails later), or abort the process
    from their C++; a second Ctrl-C does not wait. Afterwards SIGINT raises KeyboardInterrupt
    at once, as Python's own handler does, and is noted too: a library that swallows it cannot
    make the command go on as if nothing happened. Installed only over Python's default
    handler, and only from the main thread.
    """

    def __init__(self) -> None:
        self.noted = False
        self.deferred = False
        self._previous = None

    def __enter__(self) -> "_NotedInterrupts":
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread: signals are not ours to handle
            pass
        return self

    def _on_sigint(self, signum: int, frame) -> None:
        first, self.noted = not self.noted, True
        if not (self.deferred and first):
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line `argv` (default sys.argv[1:]); returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "-v" in argv or "--verbose" in argv  # until the parser has read them
    with _NotedInterrupts() as sigint:
        try:
            # The command's modules (torch, for most) are imported here, under this try: a
            # Ctrl-C meanwhile is an interrupt like any other.
            command = command_of(argv)
            sigint.deferred = True
            try:
                parser = build_parser([command] if command else [])
            finally:
                sigint.deferred = False
            if sigint.noted:
                raise KeyboardInterrupt
            try:
                args, extra = parser.parse_known_args(argv)
                if extra:  # reported by the subcommand's parser, so the hint names its --help
                    args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
            except SystemExit as e:  # --help, --version, or a usage error already printed
                return e.code if isinstance(e.code, int) else 2
            verbose = getattr(args, "verbose", False)
            _setup_logging(verbose)
            if command in _ENGINE_COMMANDS:  # torch, imported where a Ctrl-C is deferred too
                sigint.deferred = True
                try:
                    importlib.import_module("torch")
                finally:
                    sigint.deferred = False
                if sigint.noted:
                    raise KeyboardInterrupt
            code = int(args.run(args) or 0)
            if sigint.noted:  # a Ctrl-C that something on the way swallowed
                raise KeyboardInterrupt
            return code
        except KeyboardInterrupt:
            return _interrupted()
        except BrokenPipeError:  # stdout closed early (`pagedllm ... | head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        except Exception as e:
            if sigint.noted:  # the aftermath of a swallowed Ctrl-C (a half-imported module)
                return _interrupted()
            if verbose:
                raise
            code, message = describe_error(e)
            print(f"pagedllm: error: {message}", file=sys.stderr)
            return code


def _interrupted() -> int:
    print("pagedllm: interrupted", file=sys.stderr)
    _forget_unhandled_interrupt()
    return 130


def _forget_unhandled_interrupt() -> None:
    """CPython notes a KeyboardInterrupt that ends code run by PyRun_* (as extension modules
    run Python code while they import) as unhandled, even when it is caught later, and then
    kills itself with SIGINT at exit instead of exiting with our status: running an empty
    string through PyRun_SimpleString clears the note."""
    try:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"")
    except Exception:  # noqa: BLE001 - not CPython: nothing to clear
        pass


if __name__ == "__main__":
    sys.exit(main())
