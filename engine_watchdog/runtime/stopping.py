"""How the process stops on SIGTERM or SIGINT, in bounded time whatever else is going on, and
what its exit says.

The first signal sets the stop event (the runner drains the guard, then ends its tasks and
cleans up, each step bounded: net/bounded.py) and arms a backstop: a thread that ends the
process if the orderly stop has not finished by the deadline. A thread, because the one thing
the orderly stop cannot guard against is the event loop itself being held. A second signal ends
the process at once, as a shell user expects of a second Ctrl-C and as Kubernetes' SIGKILL would
a moment later anyway.

One scheme for the exit, whenever the signal comes (while the command starts, runs, drains, or
a second time): the process ends by that signal (:func:`die_by`). A shell shows 128+N, 130 for
Ctrl-C and 143 for SIGTERM; Python's ``subprocess`` shows -N; systemd counts it a clean stop.
Never 0 (``check``: healthy) and never 1 (``check``: stalled): a signal is no verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
MARGIN_S = 8.0
"""Beyond the guard's drain budget: what the bounded cleanup steps may take together."""
_stopped_by: int | None = None


def stopped_by() -> int | None:
    """The signal that stopped this process's run, or None (none did)."""
    return _stopped_by


def die_by(sig: int) -> NoReturn:
    """End the process as ``sig`` would, its buffered output flushed first. From the main
    thread by the signal itself (its default action); where that is not possible (another
    thread, or PID 1 in a container, which the kernel does not let a default action end) with
    exit code 128+sig, which a shell shows the same."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(Exception):
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            signal.raise_signal(sig)
    os._exit(128 + sig)


def hard_exit(sig: int, why: str) -> NoReturn:
    """End the process now: one line on stderr, then :func:`die_by`."""
    name = signal.Signals(sig).name
    with contextlib.suppress(OSError):
        os.write(2, f"engine-watchdog: {name}: {why}; exiting at once\n".encode())
    die_by(sig)


class Stopping:
    """The stop event of one process run, set by the first signal; see the module's text."""

    def __init__(self, budget_s: float) -> None:
        self.event = asyncio.Event()
        self.budget_s = budget_s
        """The longest the orderly stop may take (drain budget + :data:`MARGIN_S`)."""
        self.signal: int | None = None
        self._backstop: threading.Timer | None = None

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        global _stopped_by
        if self.signal is not None:
            hard_exit(sig, "second signal")
        self.signal = _stopped_by = sig
        self.event.set()
        again = "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
        log.warning(
            "%s: stopping within %.0f s; a second %s ends it at once",
            signal.Signals(sig).name,
            self.budget_s,
            again,
        )
        why = f"the orderly stop took longer than {self.budget_s:.0f} s"
        self._backstop = threading.Timer(self.budget_s, hard_exit, (sig, why))
        self._backstop.daemon = True  # an orderly exit does not wait for it
        self._backstop.start()

    def done(self) -> None:
        """The orderly stop finished: the backstop stands down."""
        if self._backstop is not None:
            self._backstop.cancel()
