"""Errors a command ends with: one line naming the fix, and an exit code of their own."""

from __future__ import annotations

# sysexits.h codes, above the verdicts (check: 0-3, replay: 0-1), so no error reads as a verdict.
EXIT_USAGE = 64  # EX_USAGE: bad input
EXIT_DATAERR = 65  # EX_DATAERR: an input file holds nothing usable (a trace)
EXIT_NOINPUT = 66  # EX_NOINPUT: an input file cannot be read
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a tool we ask (kubectl) failed or answered nonsense
EXIT_SOFTWARE = 70  # EX_SOFTWARE: a bug (or a long-lived task that died)
EXIT_CANTCREAT = 73  # EX_CANTCREAT: an output (a bundle, a trace) could not be written
EXIT_NOPERM = 77  # EX_NOPERM: not allowed (doctor: the engine is another user's, no ptrace)


class CliError(Exception):
    """Ends a command: the message is printed as one line, the process exits ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
