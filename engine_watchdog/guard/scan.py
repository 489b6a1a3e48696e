"""The guard's per-event rules for one stream: compiled (guard/_relay.c over guard/sse.c) where
the package was built with a C compiler, their Python twin (guard/tokens.py) otherwise.

Both have the same two types: ``Hist(bounds)``, the guard's histogram of gaps between tokens,
and ``Progress(hist)``, one stream's event-stream reader and token rule, fed each read the
event loop relays (``feed(data, now) -> tokens``; the relay thread feeds the same object while
it holds the stream, guard/lanes.py). ``ENGINE_WATCHDOG_PURE_PYTHON=1`` runs the twin even where
the compiled one is built (and so no relay thread).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Protocol

from engine_watchdog.guard.tokens import PyHist, PyProgress

PURE_ENV = "ENGINE_WATCHDOG_PURE_PYTHON"


class Hist(Protocol):
    @property
    def bounds(self) -> tuple[float, ...]: ...

    def note(self, gap: float, /) -> None: ...

    def snapshot(self) -> tuple[tuple[int, ...], float]: ...


class Progress(Protocol):
    @property
    def boundary(self) -> bool: ...

    def feed(self, data: bytes, now: float, /) -> int: ...


def _compiled() -> ModuleType | None:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from engine_watchdog.guard import _relay
    except ImportError:  # built without a C compiler (or on a free-threaded Python): the twin
        return None
    return _relay


relay = _compiled()
"""The compiled module, or None where the Python twin runs."""
COMPILED = relay is not None


def new_hist(bounds: tuple[float, ...]) -> Hist:
    hist: Hist = relay.Hist(bounds) if relay is not None else PyHist(bounds)
    return hist


def new_progress(hist: Hist) -> Progress:
    if relay is not None:
        progress: Progress = relay.Progress(hist)
        return progress
    assert isinstance(hist, PyHist)
    return PyProgress(hist)
