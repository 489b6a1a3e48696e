"""Alertmanager API v2 push: the watchdog's own alerts, for users without Prometheus.

``push_alerts`` is the whole client: one ``POST /api/v2/alerts``. ``AlertmanagerReporter`` turns
verdict transitions into an ``EngineStalled`` alert per engine (firing while the engine is stalled,
resolved when it leaves that state) and re-sends firing alerts periodically, as Alertmanager
expects: like Prometheus, each firing alert carries ``endsAt = now + 4 * resend interval``, so if
the watchdog dies its alerts resolve by themselves a few minutes later (and WatchdogDown fires).

The reporter implements the watcher's ``Reporter`` protocol: ``report()`` is synchronous and cheap
(it only queues), ``run()`` is the long-lived task that pushes. Neither ever raises into the
caller: failures are logged, counted (``errors``, ``last_error``) and retried on the next round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import aiohttp

from engine_watchdog.core.model import Cause, Outcome, Result, State, Transition, Verdict
from engine_watchdog.core.redact import redact_url
from engine_watchdog.net.http import error_text

log = logging.getLogger(__name__)

ALERTNAME = "EngineStalled"
ACTION_ALERTNAME = "EngineWatchdogAction"
ACTION_ALERT_S = 300.0
"""How long an action's alert stays active in Alertmanager (it resolves by itself)."""
RUNBOOK_URL = (
    "https://github.com/engine-watchdog/engine-watchdog/blob/main/docs/runbook.md#enginestalled"
)
MAX_OUTBOX = 1000
"""Resolved alerts waiting for a reachable Alertmanager; older ones are dropped past this."""


class AlertmanagerError(Exception):
    """Alertmanager answered, but not with 2xx."""


@dataclass(frozen=True)
class Alert:
    """One alert as API v2 takes it. Same labels = same alert; ``ends_at`` in the past resolves."""

    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    generator_url: str = ""

    def to_api(self) -> dict[str, Any]:
        body: dict[str, Any] = {"labels": dict(self.labels), "annotations": dict(self.annotations)}
        if self.starts_at is not None:
            body["startsAt"] = _rfc3339(self.starts_at)
        if self.ends_at is not None:
            body["endsAt"] = _rfc3339(self.ends_at)
        if self.generator_url:
            body["generatorURL"] = self.generator_url
        return body

    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.labels.items()))


def _rfc3339(t: datetime) -> str:
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


async def push_alerts(
    session: aiohttp.ClientSession, base_url: str, alerts: list[Alert], timeout_s: float
) -> None:
    """POST ``alerts`` to ``base_url``/api/v2/alerts. Raises on failure (the caller decides)."""
    if not alerts:
        return
    url = base_url.rstrip("/") + "/api/v2/alerts"
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    payload = [a.to_api() for a in alerts]
    async with session.post(url, json=payload, timeout=timeout) as resp:
        if resp.status // 100 != 2:
            text = await error_text(resp, 300)
            raise AlertmanagerError(f"POST {url}: HTTP {resp.status}: {text.strip()}")


class AlertmanagerReporter:
    """EngineStalled alerts from verdict transitions, pushed to one Alertmanager."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        resend_s: float = 60.0,
        timeout_s: float = 5.0,
        severity: str = "critical",
        extra_labels: dict[str, str] | None = None,
        generator_url: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.session = session
        self.base_url = base_url
        """Where alerts go, credentials included: only to connect."""
        self.shown_url = redact_url(base_url)
        """The same as logs and errors name it."""
        self.resend_s = resend_s
        self.timeout_s = timeout_s
        self.severity = severity
        self.extra_labels = dict(extra_labels or {})
        self.generator_url = generator_url
        self.clock = clock
        self.firing: dict[tuple[str, str], Alert] = {}
        """(target, engine) -> the firing alert."""
        self.outbox: list[Alert] = []
        """Alerts whose change (new firing, resolved) Alertmanager has not acknowledged yet."""
        self.last_push: float | None = None
        self.sent = 0
        self.errors = 0
        self.dropped = 0
        self.last_error: str | None = None

    # -- the Reporter protocol: synchronous, cheap, never raises ---------------------------
    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        try:
            for change in changes:
                self._apply(target, change)
        except Exception as exc:  # a reporter must never take the probe loop down
            self._fail(f"report: {exc!r}")

    def _apply(self, target: str, change: Transition) -> None:
        v = change.new
        key = (target, v.engine)
        old = self.firing.pop(key, None)
        if old is not None and (v.state is not State.STALLED or old.labels["cause"] != v.cause):
            self._queue(replace(old, ends_at=utc(self.clock())))
        elif old is not None:
            self.firing[key] = old  # still stalled, same cause: nothing new to say
            return
        if v.state is State.STALLED:
            alert = self._alert(target, v)
            self.firing[key] = alert
            self._queue(alert)

    def on_action(self, target: str, action: str, phase: str, outcome: Outcome | None) -> None:
        """An ActionListener: every recovery action is an alert before and after it.

        One-shot alerts (``EngineWatchdogAction``) that end by themselves after ACTION_ALERT_S;
        a restart refused by the rate limit or a failed action is critical."""
        try:
            now = self.clock()
            result = outcome.result if outcome else "started"
            bad = result in (Result.FAILED, Result.RATE_LIMITED)
            labels = {
                **self.extra_labels,
                "alertname": ACTION_ALERTNAME,
                "target": target,
                "action": action,
                "phase": phase,
                "result": result,
                "severity": "critical" if bad else "warning",
            }
            detail = outcome.detail if outcome else ""
            annotations = {
                "summary": f"engine-watchdog {action} at {target}: {result}",
                "description": detail or f"engine-watchdog is taking the {action} action.",
                "runbook_url": RUNBOOK_URL,
            }
            alert = Alert(labels, annotations, utc(now), utc(now + ACTION_ALERT_S))
            self._queue(alert)
        except Exception as exc:  # a reporter must never take the ladder down
            self._fail(f"on_action: {exc!r}")

    def _alert(self, target: str, v: Verdict) -> Alert:
        cause = v.cause or Cause.NO_PROGRESS
        labels = {
            **self.extra_labels,
            "alertname": ALERTNAME,
            "target": target,
            "engine": v.engine,
            "cause": cause,
            "severity": self.severity,
        }
        evidence = "; ".join(v.evidence) if v.evidence else "none recorded"
        annotations = {
            "summary": f"Engine {v.engine} at {target} is stalled ({cause}).",
            "description": (
                f"The watchdog judged engine {v.engine} at {target} stalled (cause {cause}) "
                f"after {v.seconds_without_progress:.0f} s with work present and no progress. "
                f"Evidence: {evidence}."
            ),
            "runbook_url": RUNBOOK_URL,
        }
        started = v.since if v.since is not None else v.t
        return Alert(labels, annotations, starts_at=utc(started), generator_url=self.generator_url)

    def _queue(self, alert: Alert) -> None:
        self.outbox = [a for a in self.outbox if a.key() != alert.key()] + [alert]
        if len(self.outbox) > MAX_OUTBOX:
            self.dropped += len(self.outbox) - MAX_OUTBOX
            self.outbox = self.outbox[-MAX_OUTBOX:]

    def _fail(self, message: str) -> None:
        self.errors += 1
        self.last_error = message
        log.warning("alertmanager: %s", message)

    # -- pushing -------------------------------------------------------------------------------
    def due(self, now: float) -> list[Alert]:
        """What a push at ``now`` sends: queued changes, plus every firing alert when a resend
        is due. Firing alerts get a fresh ``endsAt`` each time."""
        resend = bool(self.firing) and (
            self.last_push is None or now - self.last_push >= self.resend_s
        )
        if not self.outbox and not resend:
            return []
        ends = utc(now + 4 * self.resend_s)
        fresh = {k: replace(a, ends_at=ends) for k, a in self.firing.items()}
        firing_keys = {a.key() for a in fresh.values()}
        resolved = [a for a in self.outbox if a.key() not in firing_keys]
        return resolved + list(fresh.values())

    async def flush(self) -> bool:
        """Push what is due. True when nothing was due or Alertmanager took it. Never raises."""
        now = self.clock()
        pending = list(self.outbox)
        alerts = self.due(now)
        if not alerts:
            return True
        try:
            await push_alerts(self.session, self.base_url, alerts, self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = redact_url(repr(exc))
            self._fail(f"push of {len(alerts)} alert(s) to {self.shown_url} failed: {why}")
            return False
        self.sent += len(alerts)
        self.last_push = now
        self.acknowledge(pending)
        return True

    def acknowledge(self, pending: list[Alert]) -> None:
        """Drop what was sent from the outbox; keep what report() queued during the push."""
        sent = {id(a) for a in pending}
        self.outbox = [a for a in self.outbox if id(a) not in sent]

    async def run(self, poll_s: float = 1.0) -> None:
        """The pushing task: flush every ``poll_s`` seconds, forever."""
        while True:
            await self.flush()
            await asyncio.sleep(poll_s)
