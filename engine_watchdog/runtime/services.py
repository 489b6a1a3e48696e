"""The parts of one watched target that talk to services beside the engine: Kubernetes Events,
Alertmanager, the readiness gate, the engine container's log through the API. Each is built
from its own options, checked at start (a missing pod env is a SettingsError then, not at the
first stall); the runner starts their tasks (runner.py, ``Fleet.tasks``). Each module is
imported only when its option is given: a plain ``watch`` holds none of them
(docs/performance.md)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeAlias

import aiohttp

from engine_watchdog.core.settings import CaptureSettings, WatchSettings
from engine_watchdog.report.metrics import WatchdogMetrics

if TYPE_CHECKING:
    from engine_watchdog.report.alertmanager import AlertmanagerReporter
    from engine_watchdog.report.k8s_events import EventsReporter
    from engine_watchdog.report.readiness import ReadinessGate

Task = Coroutine[Any, Any, None]
Pusher: TypeAlias = "EventsReporter | AlertmanagerReporter"


def service_pushers(settings: WatchSettings, session: aiohttp.ClientSession) -> dict[str, Pusher]:
    """The reporters that push to a service (K8s Events, Alertmanager), each a long task, by
    the name of its task."""
    pushers: dict[str, Pusher] = {}
    if settings.report.k8s_events:
        from engine_watchdog.net.k8s_api import pod_for
        from engine_watchdog.report.k8s_events import EventsReporter

        where = settings.report.k8s_events
        pod = pod_for(where, "--k8s-events", "events-rbac")
        pushers["k8s-events"] = EventsReporter(session, pod)
    if settings.report.alertmanager:
        from engine_watchdog.report.alertmanager import AlertmanagerReporter

        pushers["alertmanager"] = AlertmanagerReporter(
            session, settings.report.alertmanager, extra_labels=pod_labels()
        )
    return pushers


def pod_log(
    capture: CaptureSettings, session: aiohttp.ClientSession
) -> Callable[[], Awaitable[bytes]] | None:
    """--pod-log: the engine container's log through the API, checked at start (a log file of
    its own, --engine-log or run mode's, wins)."""
    if not capture.pod_log or capture.engine_log is not None:
        return None
    from engine_watchdog.capture.pod_log import pod_log_reader
    from engine_watchdog.net.k8s_api import pod_for

    pod = pod_for(capture.pod_log_api, "--pod-log", "pod-log")
    return pod_log_reader(session, pod, capture.pod_log, capture.log_tail_bytes)


def readiness_gate(
    settings: WatchSettings,
    session: aiohttp.ClientSession,
    metrics: WatchdogMetrics,
) -> ReadinessGate | None:
    """--readiness-gate: the pod's condition from the verdicts, PATCHed by a task of its own."""
    where = settings.report.readiness_gate
    if not where:
        return None
    from engine_watchdog.net.k8s_api import pod_for
    from engine_watchdog.report.readiness import ReadinessGate

    pod = pod_for(where, "--readiness-gate", "readiness-gate")
    target = settings.url
    metrics.start_readiness(target)
    return ReadinessGate(
        session,
        pod,
        on_flip=lambda status: metrics.readiness_flips.labels(target, status).inc(),
        on_error=metrics.readiness_errors.labels(target).inc,
    )


def pod_labels() -> dict[str, str]:
    """Where the watchdog runs in Kubernetes (the downward API sets these), for alert labels."""
    names = {"POD_NAME": "pod", "POD_NAMESPACE": "namespace"}
    return {label: os.environ[env] for env, label in names.items() if os.environ.get(env)}
