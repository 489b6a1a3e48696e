"""One watched target, assembled: watcher, reporters, supervisor, supervised child, trace.

``watch`` runs one of these per engine (a per-node DaemonSet watches many); ``run`` runs one with
a supervised child. Nothing here loops: the runner names and starts the tasks (runner.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from engine_watchdog.capture.retention import cannot_write, remove_abandoned
from engine_watchdog.capture.step import CaptureStep
from engine_watchdog.core.checks import parse_listen
from engine_watchdog.core.model import Action, Outcome
from engine_watchdog.core.settings import CannotWriteError, SettingsError, WatchSettings
from engine_watchdog.net.connection import EngineConnection, connection_for
from engine_watchdog.peers.discovery import in_lws
from engine_watchdog.probes.nvml import GpuProbe
from engine_watchdog.probes.procs import url_port
from engine_watchdog.recovery.actions import EngineActions, GroupStop
from engine_watchdog.recovery.handoff import BundleHandOff
from engine_watchdog.recovery.history import ActionHistory
from engine_watchdog.recovery.orphans import end_orphan, pid_file
from engine_watchdog.recovery.supervise import ChildEngine, EngineExited
from engine_watchdog.report.metrics import WatchdogMetrics
from engine_watchdog.runtime.act.handle import EngineView
from engine_watchdog.runtime.act.supervisor import ActionListener, GuardOrders, Supervisor
from engine_watchdog.runtime.events import Bus
from engine_watchdog.runtime.pid_check import check_pids
from engine_watchdog.runtime.reporters import ConsoleReporter, MetricsReporter
from engine_watchdog.runtime.services import Pusher, Task, pod_log, readiness_gate, service_pushers
from engine_watchdog.runtime.trace.recording import RoundRecords, TraceWriter
from engine_watchdog.runtime.watch.watcher import Reporter, Watcher, watcher_for

if TYPE_CHECKING:  # imported where used: a plain watch holds none (docs/performance.md)
    from engine_watchdog.guard.proxy import Guard
    from engine_watchdog.peers.node import FindProcs
    from engine_watchdog.report.readiness import ReadinessGate
    from engine_watchdog.runtime.peering import Peering

log = logging.getLogger(__name__)
__all__ = ["ConsoleReporter", "MetricsReporter", "Target", "Task", "assemble"]
HISTORY_FILE = "actions.jsonl"


@dataclass
class Target:
    """Everything that watches one engine."""

    settings: WatchSettings
    connection: EngineConnection
    """The one engine connection every part of this target talks to the engine through."""
    watcher: Watcher
    reporters: list[Reporter]
    supervisor: Supervisor | None = None
    child: ChildEngine | None = None
    writer: TraceWriter | None = None
    guard: Guard | None = None
    peering: Peering | None = None
    """This node's peer endpoint in a multi-node group (runtime/peering.py)."""
    pushers: dict[str, Pusher] = field(default_factory=dict)
    """The reporters that push to a service, by the name of their task (services.py)."""
    gate: ReadinessGate | None = None
    """--readiness-gate's PATCHer (services.py)."""

    async def close(self) -> None:
        if self.guard is not None:
            await self.guard.stop()
        if self.peering is not None:
            await self.peering.server.stop()
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
    guard_listen: str | None = None,
    action_listeners: Sequence[ActionListener] = (),
) -> Target:
    """Each part is built with its collaborators, the ones it needs first; nothing is wired
    into a part after it is built. ``action_listeners``: told every action (after the
    metrics and the pushers)."""
    await asyncio.to_thread(check_pids, settings)
    if settings.policy.actions or guard_listen or command:  # it will write there
        await _check_incident_dir(settings.capture.incident_dir)
    bus = Bus()
    connection = connection_for(settings)  # once: watcher, probes, canary, abort, guard
    # First: a taken port is said before anything else starts.
    guard = await _guard(settings, connection, guard_listen, metrics) if guard_listen else None
    writer = TraceWriter(settings.record) if settings.record else None
    watcher, engine = _watch(settings, session, connection, bus, guard, writer)
    gpu = watcher.prober.gpu
    reporters: list[Reporter] = [
        ConsoleReporter(settings.as_json, out),
        MetricsReporter(metrics, watcher, bus.observed),
    ]
    peering = await _peering(settings, session, engine.find_procs, gpu, guard_listen)
    pushers = service_pushers(settings, session)
    gate = readiness_gate(settings, session, metrics)
    # One history for every restart, whoever asks for it (a stall, the child's exit).
    history = await _history(settings, metrics)
    child = None
    if command:
        child = await _start_child(settings, command, bus.exits.publish, echo_engine)
    fan_out = peering.capture_steps() if peering is not None else []
    peers = (fan_out, peering.group_stop() if peering is not None else None)
    listeners = [*(p.on_action for p in pushers.values()), *action_listeners]
    seen = (engine, gpu)
    supervisor = _supervisor(settings, seen, metrics, history, child, guard, bus, listeners, peers)
    if supervisor:
        reporters.append(supervisor)
    reporters += pushers.values()
    if gate is not None:
        reporters.append(gate)
    parts = (supervisor, child, writer, guard, peering, pushers, gate)
    return Target(settings, connection, watcher, reporters, *parts)


def _watch(
    settings: WatchSettings,
    session: aiohttp.ClientSession,
    connection: EngineConnection,
    bus: Bus,
    guard: Guard | None,
    writer: TraceWriter | None,
) -> tuple[Watcher, EngineView]:
    """The engine's probe rounds (the guard, when there is one, is a probe), and the engine as
    the actions know it; both on the target's bus."""
    records = RoundRecords((writer.write,) if writer else ())
    watcher = watcher_for(
        settings, session, bus=bus, records=records, connection=connection, wire=guard
    )
    canary = watcher.prober.canary
    engine = EngineView(
        settings, session, connection, bus, lambda: canary.pending, records.timeline
    )
    return watcher, engine


async def _guard(
    settings: WatchSettings, connection: EngineConnection, listen: str, metrics: WatchdogMetrics
) -> Guard:
    """The guard in front of the engine, listening: the watcher's probe."""
    from engine_watchdog.guard.proxy import Guard
    from engine_watchdog.guard.stats import GuardCollector

    # The real address and TLS trust of the one connection, never the display URL; the guard
    # gets no credential (a client without any meets the engine's own 401).
    # Its self-check's limit: the per-request threshold plus one probe round (guard/held.py).
    held_limit_s = settings.detector.request_stall_seconds + settings.probe.interval_s
    guard = Guard(replace(settings.guard, held_limit_s=held_limit_s), connection.upstream())
    try:
        await guard.start(*parse_listen(listen, "--guard-listen"))
    except OSError as exc:
        await guard.stop()
        raise SettingsError(
            f"--guard-listen {listen}: {exc.strerror or exc}; give a free host:port"
        ) from None
    metrics.registry.register(
        GuardCollector(
            settings.url,
            guard.stats,
            lambda: len(guard.open),
            lambda: bool(guard.refusal),
            guard.count,
        )
    )
    return guard


async def _peering(
    settings: WatchSettings,
    session: aiohttp.ClientSession,
    find_procs: FindProcs,
    gpu: GpuProbe | None,
    listen: str | None,
) -> Peering | None:
    """This node's peering in a group (--peers, or LeaderWorkerSet's environment); a single
    node, the common case, imports none of peers/ (its server, fan-out and restarts)."""
    if not settings.peers.peers and not in_lws(os.environ):
        return None
    from engine_watchdog.runtime.peering import target_peering

    return await target_peering(settings, session, find_procs, gpu, listen)


async def _history(settings: WatchSettings, metrics: WatchdogMetrics) -> ActionHistory:
    """The action history, once what a killed watchdog left in the incident dir is gone."""
    await _clean_incident_dir(settings.capture.incident_dir)
    write_errors = metrics.history_write_errors.labels(settings.url)
    return ActionHistory(
        settings.capture.incident_dir / HISTORY_FILE, on_write_error=lambda _: write_errors.inc()
    )


async def _start_child(
    settings: WatchSettings,
    command: list[str],
    on_exit: Callable[[EngineExited], None],
    echo: bool,
) -> ChildEngine:
    """Supervise mode's engine, started once an engine orphaned by an earlier watchdog is gone;
    its own exits go to ``on_exit`` (the supervisor decides what follows)."""
    child = _child(settings, command, on_exit, echo)
    if child.pid_path is not None:
        await asyncio.to_thread(end_orphan, child.pid_path)
    await child.start()
    return child


async def _check_incident_dir(incident_dir: Path) -> None:
    """Bundles and the action history can be written there: said now, not at the first stall,
    when the evidence would go elsewhere (capture/bundle.py falls back to a temporary folder)."""
    why = await asyncio.to_thread(cannot_write, incident_dir)
    if why is not None:
        raise CannotWriteError(
            f"--incident-dir {incident_dir}: cannot create or write it ({why}): give a folder "
            "this user may create and write"
        )


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


def _child(
    settings: WatchSettings,
    command: list[str],
    on_exit: Callable[[EngineExited], None],
    echo: bool,
) -> ChildEngine:
    if shutil.which(command[0]) is None:
        raise SettingsError(
            f"the engine command {command[0]!r} is not an executable program: check what "
            "follows -- (a path, or a name on PATH)"
        )
    capture = settings.capture
    log_path = capture.engine_log or capture.incident_dir / "engine.log"
    pid_path = pid_file(capture.incident_dir, url_port(settings.url))
    return ChildEngine(command, log_path, on_exit, echo, pid_path)


def _supervisor(
    settings: WatchSettings,
    seen: tuple[EngineView, GpuProbe | None],
    metrics: WatchdogMetrics,
    history: ActionHistory,
    child: ChildEngine | None,
    guard: Guard | None,
    bus: Bus,
    listeners: list[ActionListener],
    peers: tuple[list[CaptureStep], GroupStop | None],
) -> Supervisor | None:
    """The one decider; in run mode always (the child's exits are its to decide). ``seen``:
    the engine as the actions know it, and the GPU probe the capture reads."""
    if not settings.policy.actions and guard is None and child is None:
        return None
    (engine, gpu), (fan_out, group_stop) = seen, peers
    capture = settings.capture
    if capture.engine_log is None and child is not None:
        capture = replace(capture, engine_log=child.log_path)
    actions = EngineActions(
        engine,
        capture,
        settings.recovery,
        steps=lambda destructive: _capture_steps(destructive, gpu, fan_out),
        restarter=child.restart if child else None,
        on_bundle=metrics.count_incident,
        hand_off=_hand_off(settings, history),
        pod_log=pod_log(capture, engine.session),
        stop_group=group_stop,
    )

    def count(target: str, action: Action, phase: str, outcome: Outcome | None) -> None:
        if phase == "end" and outcome is not None:
            metrics.count_action(target, action, outcome)

    orders = None
    if guard is not None:  # its hands: it decides, the guard carries out
        orders = GuardOrders(guard, settings.guard.request_action, bus.handled)
    return Supervisor(
        settings.policy,
        actions,
        history,
        [count, *listeners],
        target=settings.url,
        orders=orders,
        exits=bus.exits,
        stuck=bus.stuck if guard is not None else None,
    )


def _capture_steps(
    destructive: bool, gpu: GpuProbe | None, fan_out: list[CaptureStep]
) -> list[CaptureStep]:
    """An incident's steps; their modules (py-spy, NVML, flight recorder) imported then."""
    from engine_watchdog.capture.steps import capture_steps

    # The fan-out on the capture rung only: a destructive capture is part of a restart.
    return [*capture_steps(destructive, gpu), *([] if destructive else fan_out)]


def _hand_off(settings: WatchSettings, history: ActionHistory) -> BundleHandOff | None:
    """--bundle-command's runner (cli/options.py checked at start that the program is there)."""
    r = settings.recovery
    if not r.bundle_command:
        return None
    return BundleHandOff(r.bundle_command, r.bundle_command_timeout_s, history, settings.url)
