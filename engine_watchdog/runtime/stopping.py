"""How the process stops on SIGTERM or SIGINT, in bounded time whatever else is going on.

The first signal sets the stop event (the runner drains the guard, then ends its tasks and
cleans up, each step bounded: net/bounded.py) and arms a backstop: a thread that ends the
process with 128+signal if the orderly stop has not finished by the deadline. A thread,
because the one thing the orderly stop cannot guard against is the event loop itself being
held. A second signal ends the process at once, with 128+signal, as a shell user expects of a
second Ctrl-C and as Kubernetes' SIGKILL would a moment later anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
MARGIN_S = 8.0
"""Beyond the guard's drain budget: what the bounded cleanup steps may take together."""


def hard_exit(sig: int, why: str) -> None:
    """End the process now: one line on stderr, the buffered output flushed, code 128+sig."""
    name = signal.Signals(sig).name
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        os.write(2, f"engine-watchdog: {name}: {why}; exiting at once\n".encode())
    os._exit(128 + sig)


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
        if self.signal is not None:
            hard_exit(sig, "second signal")
        self.signal = sig
        self.event.set()
        why = f"the orderly stop took longer than {self.budget_s:.0f} s"
        self._backstop = threading.Timer(self.budget_s, hard_exit, (sig, why))
        self._backstop.daemon = True  # an orderly exit does not wait for it
        self._backstop.start()

    def done(self) -> None:
        """The orderly stop finished: the backstop stands down."""
        if self._backstop is not None:
            self._backstop.cancel()
