"""The errors a command ends with (no heavy imports: the command line and `monitor` use them
without loading the engine)."""

from __future__ import annotations


class CliError(Exception):
    """An error shown as one line, ``pagedllm: error: <message>``.

    Args:
        message: what is wrong and, in parentheses, what to do.
        exit_code: 2 for a usage error (bad flag, bad config), 1 for a failure while running.
    """

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class UsageError(CliError):
    """A bad flag, argument or config file (exit code 2)."""

    def __init__(self, message: str):
        super().__init__(message, 2)
