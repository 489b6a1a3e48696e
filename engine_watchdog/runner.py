"""``watch``: the long-running loop, its HTTP endpoints and reporters, as named guarded tasks.

If any long-lived task dies, the process says why and exits non-zero: a watchdog that silently
stopped watching is worse than none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from engine_watchdog.config import WatchSettings, parse_listen
from engine_watchdog.model import Transition, Verdict
from engine_watchdog.report.console import transition_json, transition_line, verdict_dict
from engine_watchdog.report.metrics import WatchdogMetrics
from engine_watchdog.server import make_app, start_server
from engine_watchdog.trace import TraceWriter
from engine_watchdog.watcher import Reporter, Watcher

log = logging.getLogger(__name__)
EXIT_TASK_DIED = 70  # EX_SOFTWARE


class ConsoleReporter:
    """Prints each transition as one line (readable or JSON)."""

    def __init__(self, json_lines: bool, out: Callable[[str], None] = print) -> None:
        self.json_lines = json_lines
        self.out = out

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        for change in changes:
            line = transition_json if self.json_lines else transition_line
            self.out(line(change, target))


class MetricsReporter:
    def __init__(self, metrics: WatchdogMetrics, watcher: Watcher) -> None:
        self.metrics = metrics
        self.watcher = watcher

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        if self.watcher.last_scrape is not None:
            self.metrics.observe_scrape(target, self.watcher.last_scrape)
        self.metrics.update(target, verdicts, changes)


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
        await asyncio.sleep(next_at - time.monotonic())


def status_snapshot(watcher: Watcher) -> dict[str, Any]:
    return {
        "target": watcher.target,
        "rounds": watcher.rounds,
        "engines": [verdict_dict(v, watcher.target) for v in watcher.verdicts.values()],
    }


async def run_guarded(tasks: dict[str, Coroutine[Any, Any, None]], stop: asyncio.Event) -> int:
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
    settings: WatchSettings,
    stop: asyncio.Event | None = None,
    out: Callable[[str], None] = print,
    extra_reporters: list[Reporter] | None = None,
) -> int:
    stop = stop or _stop_on_signals()
    metrics = WatchdogMetrics()
    async with aiohttp.ClientSession() as session:
        watcher = Watcher(settings, session)
        reporters: list[Reporter] = [
            ConsoleReporter(settings.json_lines, out),
            MetricsReporter(metrics, watcher),
            *(extra_reporters or []),
        ]
        writer = TraceWriter(settings.record) if settings.record else None
        if writer:
            watcher.listeners.append(writer.write)
        server = None
        if settings.listen:
            app = make_app(
                metrics.registry,
                lambda: status_snapshot(watcher),
                live=lambda: (True, "watching"),
                ready=lambda: (watcher.rounds > 0, f"{watcher.rounds} probe rounds"),
            )
            server = await start_server(app, *parse_listen(settings.listen))
        try:
            return await run_guarded({"probe-loop": probe_loop(watcher, reporters)}, stop)
        finally:
            if server:
                await server.cleanup()
            if writer:
                writer.close()


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop
