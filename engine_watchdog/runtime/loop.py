"""The process's event loop: uvloop while the guard runs, the standard library's otherwise.

The guard's data path is the one place where the loop's own cost per event shows: every
streamed event is a read, a write and a pass through the loop. On uvloop (libuv, the loop in C)
the guard's CPU per event is 0.78-0.89 of what it is on asyncio's loop, about what a bare byte
relay costs on asyncio's (docs/performance.md). Without a guard the watchdog does a few probe
rounds a second, where the loop's cost is nothing, so it keeps the standard loop there.

It also hands the C heap's free pages back once start-up is over (:func:`release_freed_memory`).
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import signal
from collections.abc import Coroutine
from typing import Any

from engine_watchdog.core.settings import ProcessSettings, SettingsError


def loop_of(process: ProcessSettings) -> str:
    """The loop the process runs: "uvloop" or "asyncio" (raises when uvloop is asked for and
    is not installed)."""
    if not process.guard_listen or process.event_loop == "asyncio":
        return "asyncio"
    installed = importlib.util.find_spec("uvloop") is not None
    if process.event_loop == "uvloop" and not installed:
        raise SettingsError(
            "--guard-loop uvloop: uvloop is not installed (pip install uvloop), "
            "or give --guard-loop asyncio"
        )
    return "uvloop" if installed else "asyncio"


def run(main: Coroutine[Any, Any, int], process: ProcessSettings) -> int:
    """Run ``main`` to its end on the loop :func:`loop_of` picks; its exit code."""
    try:
        kind = loop_of(process)
    except SettingsError:
        main.close()  # never started: no "never awaited" warning after the one-line error
        raise
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        # Python's own behaviour under another name: asyncio's runner then leaves SIGINT alone.
        # Its own handler cancels the main task, and a Ctrl-C before the watchdog's handler is
        # in (runtime/stopping.py) was lost in a start that went on (test_stopping, at once).
        signal.signal(signal.SIGINT, _interrupt)
    if kind == "asyncio":
        return asyncio.run(main)
    import uvloop

    return uvloop.run(main)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``).

    Start-up leaves garbage that glibc keeps: imports compiled from source where no ``.pyc``
    exists (an image built without them, a read-only tree), NVML's initialisation, the first
    GPM pair. Measured (docs/performance.md): the imports of ``watch`` compiled from source leave
    62 MB of RSS on the 2-core machine, 50 MB after this, against 47 MB with ``.pyc`` files.
    Elsewhere (musl, macOS) there is no such call and nothing to do."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
