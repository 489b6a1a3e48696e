"""Kubernetes Events for incidents: a stall and each recovery action become an Event on the
engine's pod (``kubectl describe pod`` and ``kubectl get events`` show them).

In-cluster only: the API server from KUBERNETES_SERVICE_HOST/PORT, the service account's token
and CA from the projected volume, the pod from the downward API (POD_NAME, POD_NAMESPACE,
POD_UID; deploy/kubernetes/components/events-rbac). No Kubernetes client library: one POST.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp

from engine_watchdog.core.model import Outcome, State, Transition, Verdict
from engine_watchdog.net.http import error_text

log = logging.getLogger(__name__)
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class PodRef:
    api: str
    """API server base URL."""
    namespace: str
    name: str
    uid: str
    token_file: Path | None = SA_DIR / "token"
    ca_file: Path | None = SA_DIR / "ca.crt"


def pod_from_env(api: str | None = None, env: dict[str, str] | None = None) -> PodRef:
    """The pod this watchdog runs in; ValueError naming what is missing. ``api`` overrides the
    in-cluster API server (e.g. http://127.0.0.1:8001 behind ``kubectl proxy``)."""
    env = dict(os.environ if env is None else env)
    needed = ("POD_NAME", "POD_NAMESPACE") + (() if api else ("KUBERNETES_SERVICE_HOST",))
    missing = [k for k in needed if not env.get(k)]
    if missing:
        raise ValueError(
            f"--k8s-events needs {', '.join(missing)} (the events-rbac component sets them)"
        )
    if not api:
        host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
        api = f"https://{host}:{port}"
    return PodRef(api.rstrip("/"), env["POD_NAMESPACE"], env["POD_NAME"], env.get("POD_UID", ""))


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
        url = f"{self.pod.api}/api/v1/namespaces/{self.pod.namespace}/events"
        headers = {}
        if self.pod.token_file is not None and self.pod.token_file.exists():
            # Projected tokens rotate: read it for every request.
            token = await asyncio.to_thread(self.pod.token_file.read_text)
            headers["Authorization"] = f"Bearer {token.strip()}"
        ctx: ssl.SSLContext | bool = _tls(self.pod.ca_file) if url.startswith("https") else True
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with self.session.post(
            url, json=event, headers=headers, ssl=ctx, timeout=timeout
        ) as r:
            if r.status // 100 != 2:
                raise RuntimeError(f"HTTP {r.status}: {await error_text(r)}")


def _tls(ca_file: Path | None) -> ssl.SSLContext:
    if ca_file is not None and ca_file.exists():
        return ssl.create_default_context(cafile=str(ca_file))
    return ssl.create_default_context()
