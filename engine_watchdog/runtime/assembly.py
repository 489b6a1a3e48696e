"""One watched target, assembled: watcher, reporters, supervisor, supervised child, trace.

``watch`` runs one of these per engine (a per-node DaemonSet watches many); ``run`` runs one with
a supervised child. Nothing here loops: the runner owns the tasks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from engine_watchdog.capture.retention import remove_abandoned
from engine_watchdog.capture.steps import capture_steps
from engine_watchdog.core.model import Action, Outcome, Transition, Verdict
from engine_watchdog.core.settings import SettingsError, WatchSettings, parse_listen
from engine_watchdog.guard.proxy import Guard
from engine_watchdog.guard.stats import GuardCollector
from engine_watchdog.net.access import access_for
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.probes.procs import url_port
from engine_watchdog.recovery.actions import EngineActions
from engine_watchdog.recovery.history import ActionHistory
from engine_watchdog.recovery.orphans import end_orphan, pid_file
from engine_watchdog.recovery.supervise import ChildEngine
from engine_watchdog.report.alertmanager import AlertmanagerReporter
from engine_watchdog.report.console import transition_json, transition_line
from engine_watchdog.report.k8s_events import EventsReporter, pod_from_env
from engine_watchdog.report.metrics import WatchdogMetrics
from engine_watchdog.runtime.pid_check import check_pids
from engine_watchdog.runtime.recording import TraceWriter
from engine_watchdog.runtime.supervisor import Supervisor
from engine_watchdog.runtime.watcher import Reporter, Watcher

log = logging.getLogger(__name__)
HISTORY_FILE = "actions.jsonl"
Task = Coroutine[Any, Any, None]


class ConsoleReporter:
    """Prints each transition as one line (readable or JSON)."""

    def __init__(self, as_json: bool, out: Callable[[str], None] = print) -> None:
        self.as_json = as_json
        self.out = out

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        for change in changes:
            line = transition_json if self.as_json else transition_line
            self.out(line(change, target))


class MetricsReporter:
    """Stall verdicts counted into the watchdog's own metrics; every probe's result through the
    watcher's records. The verdicts themselves are read at scrape time."""

    PROBES = {
        "scrape": "metrics",
        "health": "health",
        "canary": "canary",
        "gpu": "gpu",
        "procs": "procs",
    }

    def __init__(self, metrics: WatchdogMetrics, watcher: Watcher) -> None:
        self.metrics = metrics
        self.watcher = watcher
        metrics.start_target(watcher.target, lambda: watcher.verdicts)
        watcher.listeners.append(self.on_record)

    def on_record(self, rec: dict[str, Any]) -> None:
        kind = str(rec.get("kind"))
        probe = self.PROBES.get(kind)
        if probe is None:
            return  # not a probe's result (a restart we made, the settings judged with)
        ok = rec["ok"] if "ok" in rec else rec.get("error") is None
        self.metrics.observe_probe(self.watcher.target, probe, float(rec["t"]), bool(ok))
        if kind == "scrape" and rec.get("elapsed_s") is not None:
            self.metrics.scrape_duration.labels(self.watcher.target).observe(rec["elapsed_s"])

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        self.metrics.count_stalls(target, changes)


@dataclass
class Target:
    """Everything that watches one engine."""

    settings: WatchSettings
    watcher: Watcher
    reporters: list[Reporter]
    supervisor: Supervisor | None = None
    child: ChildEngine | None = None
    writer: TraceWriter | None = None
    guard: Guard | None = None
    tasks: dict[str, Task] = field(default_factory=dict)

    async def close(self) -> None:
        if self.guard is not None:
            await self.guard.stop()
        self.watcher.close()
        incident = self.supervisor.incident if self.supervisor else None
        if incident is not None and not incident.done():
            incident.cancel()
        if self.child:
            await self.child.stop()
        if self.writer:
            self.writer.close()


async def assemble(
    settings: WatchSettings,
    session: aiohttp.ClientSession,
    metrics: WatchdogMetrics,
    out: Callable[[str], None],
    command: list[str] | None = None,
    echo_engine: bool = True,
) -> Target:
    await asyncio.to_thread(check_pids, settings)
    watcher = Watcher(settings, session)
    target = Target(settings, watcher, [ConsoleReporter(settings.as_json, out)])
    if settings.guard.listen:  # first: a taken port is said before anything else starts
        target.guard = await _guard(settings, watcher, metrics)
    target.reporters.append(MetricsReporter(metrics, watcher))
    if settings.record:
        target.writer = TraceWriter(settings.record)
        watcher.listeners.append(target.writer.write)
    # One history for both restart paths (the supervisor's and the supervised child's own), so
    # the restart limit is counted in one memory.
    history = await _history(settings, metrics)
    if command:
        target.child = await _start_child(settings, command, history, echo_engine)
        target.tasks[f"engine-exits:{settings.url}"] = target.child.watch_exits()
    target.supervisor = _supervisor(settings, watcher, metrics, history, target.child)
    if target.supervisor:
        target.reporters.append(target.supervisor)
        if target.guard is not None:
            _guard_orders(settings, watcher, target.supervisor, target.guard)
    if settings.report.k8s_events:
        _add_events(target, settings.report.k8s_events, session)
    if settings.report.alertmanager:
        pusher = AlertmanagerReporter(
            session, settings.report.alertmanager, extra_labels=_pod_labels()
        )
        target.reporters.append(pusher)
        if target.supervisor:
            target.supervisor.listeners.append(pusher.on_action)
        target.tasks[f"alertmanager:{settings.url}"] = pusher.run()
    return target


async def _guard(settings: WatchSettings, watcher: Watcher, metrics: WatchdogMetrics) -> Guard:
    """The guard in front of the engine, listening: the watcher's probe."""
    assert settings.guard.listen is not None
    # The real address and TLS trust, never the display URL; the guard gets no credential.
    full_url = settings.connect_url or settings.url
    connection = EngineConnection.of(full_url, access_for(settings.probe))
    guard = Guard(settings.guard, connection.upstream())
    try:
        await guard.start(*parse_listen(settings.guard.listen, "--guard-listen"))
    except OSError as exc:
        await guard.stop()
        raise SettingsError(
            f"--guard-listen {settings.guard.listen}: {exc.strerror or exc}; give a free host:port"
        ) from None
    watcher.wire = guard
    metrics.registry.register(
        GuardCollector(
            settings.url, guard.stats, lambda: len(guard.open), lambda: bool(guard.refusal)
        )
    )
    return guard


def _guard_orders(
    settings: WatchSettings, watcher: Watcher, supervisor: Supervisor, guard: Guard
) -> None:
    """The supervisor's hands: it decides, the guard carries out."""
    supervisor.guard = guard
    supervisor.request_action = settings.guard.request_action
    supervisor.note = watcher.note
    watcher.stuck_listeners.append(supervisor.on_stuck)


async def _history(settings: WatchSettings, metrics: WatchdogMetrics) -> ActionHistory:
    """The action history, once what a killed watchdog left in the incident dir is gone."""
    await _clean_incident_dir(settings.capture.incident_dir)
    write_errors = metrics.history_write_errors.labels(settings.url)
    return ActionHistory(
        settings.capture.incident_dir / HISTORY_FILE, on_write_error=lambda _: write_errors.inc()
    )


async def _start_child(
    settings: WatchSettings, command: list[str], history: ActionHistory, echo: bool
) -> ChildEngine:
    """Supervise mode's engine, started once an engine orphaned by an earlier watchdog is gone."""
    child = _child(settings, command, history, echo)
    if child.pid_path is not None:
        await asyncio.to_thread(end_orphan, child.pid_path)
    await child.start()
    return child


async def _clean_incident_dir(incident_dir: Path) -> None:
    """What a watchdog killed mid-capture left: temporary bundles no live writer holds."""
    removed = await asyncio.to_thread(remove_abandoned, incident_dir)
    if removed:
        log.warning(
            "removed %d temporary bundle(s) in %s left by a watchdog that died mid-capture: %s",
            len(removed),
            incident_dir,
            ", ".join(removed),
        )


def _add_events(target: Target, where: str, session: aiohttp.ClientSession) -> None:
    try:
        pod = pod_from_env(None if where == "in-cluster" else where)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    events = EventsReporter(session, pod)
    target.reporters.append(events)
    if target.supervisor:
        target.supervisor.listeners.append(events.on_action)
    target.tasks[f"k8s-events:{target.settings.url}"] = events.run()


def _child(
    settings: WatchSettings, command: list[str], history: ActionHistory, echo: bool
) -> ChildEngine:
    if shutil.which(command[0]) is None:
        raise SettingsError(
            f"the engine command {command[0]!r} is not an executable program: check what "
            "follows -- (a path, or a name on PATH)"
        )
    capture = settings.capture
    log_path = capture.engine_log or capture.incident_dir / "engine.log"
    pid_path = pid_file(capture.incident_dir, url_port(settings.url))
    limit = settings.policy.rate_limit
    return ChildEngine(command, log_path, history, settings.url, limit, echo, pid_path)


def _supervisor(
    settings: WatchSettings,
    watcher: Watcher,
    metrics: WatchdogMetrics,
    history: ActionHistory,
    child: ChildEngine | None,
) -> Supervisor | None:
    if not settings.policy.actions and not settings.guard.listen:
        return None
    capture = settings.capture
    if capture.engine_log is None and child is not None:
        capture = replace(capture, engine_log=child.log_path)
    actions = EngineActions(
        watcher,
        capture,
        settings.recovery,
        steps=lambda destructive: capture_steps(destructive, watcher.gpu),
        restarter=child.restart if child else None,
        on_bundle=metrics.count_incident,
    )

    def count(target: str, action: Action, phase: str, outcome: Outcome | None) -> None:
        if phase == "end" and outcome is not None:
            metrics.count_action(target, action, outcome)

    return Supervisor(settings.policy, actions, history, [count])


def _pod_labels() -> dict[str, str]:
    """Where the watchdog runs in Kubernetes (the downward API sets these), for alert labels."""
    names = {"POD_NAME": "pod", "POD_NAMESPACE": "namespace"}
    return {label: os.environ[env] for env, label in names.items() if os.environ.get(env)}
