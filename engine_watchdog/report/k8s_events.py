"""Kubernetes Events for incidents: a stall and each recovery action become an Event on the
engine's pod (``kubectl describe pod`` and ``kubectl get events`` show them).

The pod, the API server and the credentials as net/k8s_api.py finds them (the downward API's
POD_NAME, POD_NAMESPACE, POD_UID; deploy/kubernetes/components/events-rbac). One POST each.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

import aiohttp

from engine_watchdog.core.model import Outcome, State, Transition, Verdict
from engine_watchdog.net.k8s_api import PodRef, call, pod_from_env

__all__ = ["EventsReporter", "PodRef", "pod_from_env"]
log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventsReporter:
    """A Reporter and ActionListener: queues Events, a task posts them; never raises."""

    def __init__(self, session: aiohttp.ClientSession, pod: PodRef, timeout_s: float = 5.0) -> None:
        self.session = session
        self.pod = pod
        self.timeout_s = timeout_s
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=100)
        self.sent = 0
        self.errors = 0

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        for change in changes:
            v = change.new
            if v.state is State.STALLED:
                why = f"engine {v.engine} at {target} stalled ({v.cause})"
                evidence = "; ".join(v.evidence)
                self._put("EngineStalled", f"{why}: {evidence}" if evidence else why)

    def on_action(self, target: str, action: str, phase: str, outcome: Outcome | None) -> None:
        if phase == "end" and outcome is not None:
            reason = "EngineWatchdog" + action.capitalize()
            self._put(reason, f"{action} {outcome.result}: {outcome.detail}")

    def _put(self, reason: str, message: str) -> None:
        try:
            self.queue.put_nowait(self._event(reason, message[:1000]))
        except asyncio.QueueFull:
            self.errors += 1

    def _event(self, reason: str, message: str) -> dict[str, Any]:
        stamp = _now()
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.pod.name}.", "namespace": self.pod.namespace},
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "namespace": self.pod.namespace,
                "name": self.pod.name,
                "uid": self.pod.uid,
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "engine-watchdog"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }

    async def run(self) -> None:
        """The posting task: one Event at a time, forever."""
        while True:
            event = await self.queue.get()
            try:
                await self._post(event)
                self.sent += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, RuntimeError) as exc:
                self.errors += 1
                log.warning("kubernetes event %s not posted: %s", event["reason"], exc)

    async def _post(self, event: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{self.pod.namespace}/events"
        await call(self.session, self.pod, "POST", path, event, timeout_s=self.timeout_s)
