"""``watch`` and ``run``: the long-running loops, the HTTP endpoints, as named guarded tasks.

If any long-lived task dies, the process says why and exits non-zero: a watchdog that silently
stopped watching is worse than none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from engine_watchdog.core.settings import WatchSettings, parse_listen
from engine_watchdog.report.console import verdict_dict
from engine_watchdog.report.metrics import WatchdogMetrics
from engine_watchdog.runtime.assembly import ConsoleReporter, Target, Task, assemble
from engine_watchdog.runtime.server import make_app, start_server
from engine_watchdog.runtime.supervisor import ActionListener
from engine_watchdog.runtime.watcher import Reporter, Watcher

__all__ = ["ConsoleReporter", "probe_loop", "run_guarded", "run_watch"]
log = logging.getLogger(__name__)
EXIT_TASK_DIED = 70  # EX_SOFTWARE


def print_line(line: str) -> None:
    # Flushed: stdout is a pipe or a file in a container (block-buffered), and a log shipper or
    # `tail -f` must see a stall when it is said, not 8 KB of verdicts later.
    print(line, flush=True)


async def probe_loop(
    watcher: Watcher, reporters: list[Reporter], rounds: int | None = None
) -> None:
    """Probe at a fixed rate (a slow round delays the next, never piles rounds up)."""
    interval = watcher.settings.probe.interval_s
    next_at = time.monotonic()
    done = 0
    while rounds is None or done < rounds:
        changes = await watcher.tick()
        for reporter in reporters:
            reporter.report(watcher.target, changes, watcher.verdicts)
        done += 1
        next_at = max(next_at + interval, time.monotonic())
        with contextlib.suppress(TimeoutError):  # a canary's end starts the next round early
            await asyncio.wait_for(watcher.woken.wait(), next_at - time.monotonic())
        watcher.woken.clear()


def status_snapshot(targets: Sequence[Target]) -> dict[str, Any]:
    engines = [
        verdict_dict(v, t.watcher.target) for t in targets for v in t.watcher.verdicts.values()
    ]
    return {"targets": [t.watcher.target for t in targets], "engines": engines}


async def run_guarded(tasks: dict[str, Task], stop: asyncio.Event) -> int:
    """Run named tasks until ``stop`` is set (exit 0) or one of them ends (exit 70)."""
    running: set[asyncio.Task[None]] = {
        asyncio.create_task(coro, name=name) for name, coro in tasks.items()
    }
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        done, _ = await asyncio.wait({*running, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*running, stopper):
            task.cancel()
        await asyncio.gather(*running, stopper, return_exceptions=True)
    for task in done - {stopper}:
        exc = task.exception() if not task.cancelled() else None
        log.error("task %s ended unexpectedly: %r; exiting", task.get_name(), exc)
        return EXIT_TASK_DIED
    return 0


async def run_watch(
    settings: WatchSettings | Sequence[WatchSettings],
    stop: asyncio.Event | None = None,
    out: Callable[[str], None] = print_line,
    extra_reporters: list[Reporter] | None = None,
    command: list[str] | None = None,
    echo_engine: bool = True,
    action_listeners: list[ActionListener] | None = None,
) -> int:
    """Watch engines until stopped; with ``command`` (one engine), start and supervise it too.
    ``extra_reporters`` see every round's verdicts, ``action_listeners`` every action."""
    many = [settings] if isinstance(settings, WatchSettings) else list(settings)
    stop = stop or _stop_on_signals()
    metrics = WatchdogMetrics()
    async with aiohttp.ClientSession() as session:
        targets: list[Target] = []
        try:
            for s in many:
                targets.append(await assemble(s, session, metrics, out, command, echo_engine))
                if targets[-1].supervisor is not None:
                    targets[-1].supervisor.listeners.extend(action_listeners or [])
            tasks: dict[str, Task] = {}
            for t in targets:
                tasks.update(t.tasks)
                reporters = [*t.reporters, *(extra_reporters or [])]
                tasks[f"probe-loop:{t.settings.url}"] = probe_loop(t.watcher, reporters)
            server = await _serve(many[0], metrics, targets)
            try:
                return await run_guarded(tasks, stop)
            finally:
                if server:
                    await server.cleanup()
        finally:
            await asyncio.gather(*(t.close() for t in targets), return_exceptions=True)


async def _serve(
    settings: WatchSettings, metrics: WatchdogMetrics, targets: list[Target]
) -> web.AppRunner | None:
    if not settings.listen:
        return None

    def live() -> tuple[bool, str]:
        failed = [t.settings.url for t in targets if t.supervisor and t.supervisor.liveness_failed]
        if failed:
            return False, f"the recovery policy says these engines must restart: {failed}"
        return True, "watching"

    def ready() -> tuple[bool, str]:
        rounds = min(t.watcher.rounds for t in targets)
        return rounds > 0, f"{rounds} probe rounds"

    app = make_app(metrics.registry, lambda: status_snapshot(targets), live=live, ready=ready)
    return await start_server(app, *parse_listen(settings.listen))


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop
