"""Errors a command ends with: one line naming the fix, and an exit code of their own."""

from __future__ import annotations

EXIT_USAGE = 64  # EX_USAGE: bad input
EXIT_CANTCREAT = 73  # EX_CANTCREAT: an output (a bundle) could not be written


class CliError(Exception):
    """Ends a command: the message is printed as one line, the process exits ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
