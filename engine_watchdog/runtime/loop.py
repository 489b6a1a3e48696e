"""The process's event loop: uvloop while the guard runs, the standard library's otherwise.

The guard's data path is the one place where the loop's own cost per event shows: every
streamed event is a read, a write and a pass through the loop. On uvloop (libuv, the loop in C)
the guard's CPU per event is 0.78-0.89 of what it is on asyncio's loop, about what a bare byte
relay costs on asyncio's (docs/performance.md). Without a guard the watchdog does a few probe
rounds a second, where the loop's cost is nothing, so it keeps the standard loop there.

It also hands the C heap's free pages back once start-up is over (:func:`release_freed_memory`),
and keeps the threads of the blocking calls, and their heaps, few (:func:`bound_blocking`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import importlib.util
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
    if kind == "asyncio":
        return asyncio.run(main)
    import uvloop

    return uvloop.run(main)


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
ARENAS = 2


def blocking_threads(targets: int) -> int:
    """Threads for the blocking calls (psutil, NVML, bundle writes): a round of one engine uses
    a few at once. asyncio's default is min(32, cores + 4), 20 on a 16-core GPU node."""
    return min(32, 4 + 2 * targets)


def bound_blocking(targets: int) -> None:
    """A bounded pool for ``asyncio.to_thread`` and at most :data:`ARENAS` glibc heaps for its
    threads. glibc gives threads heaps of their own, up to 8 per core: each thread that ever
    allocated keeps one, pages and all, so on the H200's 16-core node the watch held more
    memory than on 2 cores for the same work (docs/performance.md)."""
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(blocking_threads(targets), "blocking")
    )
    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, ARENAS)
    except (OSError, AttributeError):  # not glibc: its own allocator, nothing to bound
        return


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
