"""``watch``: the long-running loop, its HTTP endpoints and reporters, as named guarded tasks.

If any long-lived task dies, the process says why and exits non-zero: a watchdog that silently
stopped watching is worse than none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from engine_watchdog.capture.bundle import BundleSettings
from engine_watchdog.capture.steps import capture_steps
from engine_watchdog.config import WatchSettings, parse_listen
from engine_watchdog.model import Transition, Verdict
from engine_watchdog.recovery.actions import EngineActions, RecoverySettings
from engine_watchdog.recovery.history import ActionHistory
from engine_watchdog.recovery.supervise import ChildEngine
from engine_watchdog.report.alertmanager import AlertmanagerReporter
from engine_watchdog.report.console import transition_json, transition_line, verdict_dict
from engine_watchdog.report.metrics import WatchdogMetrics
from engine_watchdog.server import make_app, start_server
from engine_watchdog.supervisor import Outcome, Supervisor
from engine_watchdog.trace import TraceWriter
from engine_watchdog.watcher import Reporter, Watcher

log = logging.getLogger(__name__)
EXIT_TASK_DIED = 70  # EX_SOFTWARE
HISTORY_FILE = "actions.jsonl"


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
    """Verdicts into the watchdog's own metrics; every probe's result via the watcher's records."""

    PROBES = {"scrape": "metrics", "health": "health", "canary": "canary", "gpu": "gpu"}

    def __init__(self, metrics: WatchdogMetrics, watcher: Watcher) -> None:
        self.metrics = metrics
        self.watcher = watcher
        metrics.start_target(watcher.target)
        watcher.listeners.append(self.on_record)

    def on_record(self, rec: dict[str, Any]) -> None:
        kind = str(rec.get("kind"))
        probe = self.PROBES.get(kind, kind)
        ok = rec["ok"] if "ok" in rec else rec.get("error") is None
        self.metrics.observe_probe(self.watcher.target, probe, float(rec["t"]), bool(ok))
        if kind == "scrape" and rec.get("elapsed_s") is not None:
            self.metrics.scrape_duration.labels(self.watcher.target).observe(rec["elapsed_s"])

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
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
    command: list[str] | None = None,
    echo_engine: bool = True,
) -> int:
    """Watch one engine until stopped; with ``command``, start and supervise it too."""
    stop = stop or _stop_on_signals()
    metrics = WatchdogMetrics()
    async with aiohttp.ClientSession() as session:
        watcher = Watcher(settings, session)
        writer = TraceWriter(settings.record) if settings.record else None
        if writer:
            watcher.listeners.append(writer.write)
        tasks: dict[str, Coroutine[Any, Any, None]] = {}
        child = await _start_child(settings, command, tasks, echo_engine)
        supervisor = _supervisor(settings, watcher, metrics, child)
        reporters: list[Reporter] = [
            ConsoleReporter(settings.json_lines, out),
            MetricsReporter(metrics, watcher),
            *([supervisor] if supervisor else []),
            *(extra_reporters or []),
        ]
        if settings.alertmanager:
            pusher = AlertmanagerReporter(
                session, settings.alertmanager, extra_labels=_pod_labels()
            )
            reporters.append(pusher)
            tasks["alertmanager"] = pusher.run()
        tasks["probe-loop"] = probe_loop(watcher, reporters)
        server = await _serve(settings, metrics, watcher, supervisor)
        try:
            return await run_guarded(tasks, stop)
        finally:
            await _shutdown(watcher, supervisor, child, server, writer)


async def _start_child(
    settings: WatchSettings,
    command: list[str] | None,
    tasks: dict[str, Coroutine[Any, Any, None]],
    echo: bool,
) -> ChildEngine | None:
    if not command:
        return None
    child = ChildEngine(
        command,
        settings.engine_log or settings.incident_dir / "engine.log",
        ActionHistory(settings.incident_dir / HISTORY_FILE),
        settings.url,
        settings.policy.rate_limit,
        echo,
    )
    await child.start()
    tasks["engine-exits"] = child.watch_exits()
    return child


def _supervisor(
    settings: WatchSettings, watcher: Watcher, metrics: WatchdogMetrics, child: ChildEngine | None
) -> Supervisor | None:
    if not settings.policy.actions:
        return None
    bundle = BundleSettings(
        settings.incident_dir,
        engine=settings.engine,
        engine_log=settings.engine_log or (child.log_path if child else None),
        tar=settings.tar,
    )
    actions = EngineActions(
        watcher,
        RecoverySettings(bundle, settings.restart_command),
        steps=lambda destructive: capture_steps(destructive, watcher.gpu),
        restarter=child.restart if child else None,
        on_bundle=lambda target, cause: metrics.incidents.labels(target, cause).inc(),
    )
    history = ActionHistory(settings.incident_dir / HISTORY_FILE)
    return Supervisor(settings.policy, actions, history, [ActionMetrics(metrics).on_action])


async def _serve(
    settings: WatchSettings,
    metrics: WatchdogMetrics,
    watcher: Watcher,
    supervisor: Supervisor | None,
) -> web.AppRunner | None:
    if not settings.listen:
        return None

    def live() -> tuple[bool, str]:
        if supervisor is not None and supervisor.liveness_failed:
            return False, "the recovery policy says the engine must be restarted"
        return True, "watching"

    app = make_app(
        metrics.registry,
        lambda: status_snapshot(watcher),
        live=live,
        ready=lambda: (watcher.rounds > 0, f"{watcher.rounds} probe rounds"),
    )
    return await start_server(app, *parse_listen(settings.listen))


async def _shutdown(
    watcher: Watcher,
    supervisor: Supervisor | None,
    child: ChildEngine | None,
    server: web.AppRunner | None,
    writer: TraceWriter | None,
) -> None:
    watcher.close()
    if supervisor and supervisor.incident and not supervisor.incident.done():
        supervisor.incident.cancel()
        await asyncio.gather(supervisor.incident, return_exceptions=True)
    if child:
        await child.stop()
    if server:
        await server.cleanup()
    if writer:
        writer.close()


class ActionMetrics:
    """Every action: a metric before (nothing) and after (result), and the restart-limit gauge."""

    def __init__(self, metrics: WatchdogMetrics) -> None:
        self.metrics = metrics

    def on_action(self, target: str, action: str, phase: str, outcome: Outcome | None) -> None:
        if phase != "end" or outcome is None:
            return
        result = outcome.result.replace("-", "_")
        self.metrics.actions.labels(target, action, result).inc()
        if action == "restart":
            limited = 1 if outcome.result == "rate_limited" else 0
            self.metrics.restart_limit.labels(target).set(limited)


def _pod_labels() -> dict[str, str]:
    """Where the watchdog runs in Kubernetes (the downward API sets these), for alert labels."""
    names = {"POD_NAME": "pod", "POD_NAMESPACE": "namespace"}
    return {label: os.environ[env] for env, label in names.items() if os.environ.get(env)}


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop
