"""A loopback stand-in for the Kubernetes API server's pods/status and pods/log endpoints,
checking each request the way the API server does: the path (namespace, pod), the verb, the
bearer token of the service account, the patch type, the body's shape; for a log, the container
and the limitBytes/tailLines bounds. What it refuses it answers as the API server would: 401
(token), 403 (a Role without pods/log), 404 (another pod), 400 (no such container), 405 (verb),
415 (patch type), 422 (body).

No real API server runs here (none is installable); this is what --readiness-gate and --pod-log
were tested against (docs/kubernetes.md says so).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from engine_watchdog.sim.launcher import free_port

CONDITION_KEYS = {"type", "status", "reason", "message", "lastTransitionTime"}
CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@dataclass
class FakeApi:
    namespace: str
    pod: str
    token: str
    conditions: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    """Every condition accepted, with the monotonic time it arrived."""
    refused: list[tuple[int, str]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    port: int = 0
    logs: dict[str, bytes] = field(default_factory=dict)
    """Container name -> its whole log, served by pods/log."""
    log_allowed: bool = True
    """False: the Role has no get on pods/log (403)."""
    log_queries: list[dict[str, str]] = field(default_factory=list)

    async def start(self, tls: ssl.SSLContext | None) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, ssl_context=tls).start()
        return f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def statuses(self) -> list[str]:
        return [c["status"] for _, c in self.conditions]

    async def handle(self, request: web.Request) -> web.Response:
        if request.path.endswith("/log"):
            return self._log(request)
        status, why = await self._check(request)
        if status != 200:
            self.refused.append((status, why))
            body = {"kind": "Status", "status": "Failure", "message": why, "code": status}
            return web.json_response(body, status=status)
        return web.json_response({"kind": "Pod", "metadata": {"name": self.pod}})

    def _log(self, request: web.Request) -> web.Response:
        self.log_queries.append(dict(request.query))
        status, why = self._log_check(request)
        if status != 200:
            self.refused.append((status, why))
            body = {"kind": "Status", "status": "Failure", "message": why, "code": status}
            return web.json_response(body, status=status)
        text = self.logs[request.query["container"]]
        if "tailLines" in request.query:
            text = b"".join(text.splitlines(keepends=True)[-int(request.query["tailLines"]) :])
        if "limitBytes" in request.query:  # the API server cuts the start: what limitBytes keeps
            text = text[: int(request.query["limitBytes"])]
        return web.Response(body=text, content_type="text/plain")

    def _log_check(self, request: web.Request) -> tuple[int, str]:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, "Unauthorized"
        if request.path != f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/log":
            return 404, f"not found: {request.path}"
        if request.method != "GET":
            return 405, f"method {request.method} not allowed"
        if not self.log_allowed:
            return 403, 'pods "vllm-0" is forbidden: cannot get resource "pods/log"'
        container = request.query.get("container", "")
        if container not in self.logs:
            return 400, f"container {container} is not valid for pod {self.pod}"
        return 200, ""

    async def _check(self, request: web.Request) -> tuple[int, str]:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, "Unauthorized"
        want = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/status"
        if request.path != want:
            return 404, f"not found: {request.path}"
        if request.method != "PATCH":
            return 405, f"method {request.method} not allowed"
        ctype = request.headers.get("Content-Type", "")
        if ctype != "application/strategic-merge-patch+json":
            # The API takes merge-patch too, but it would replace every condition of the pod
            # (the kubelet's Ready with them): the stand-in takes only what keeps them.
            return 415, f"unsupported patch type {ctype!r} for this stand-in"
        try:
            doc = json.loads(await request.read())
        except ValueError:
            return 400, "body is not JSON"
        problem = _shape(doc)
        if problem:
            return 422, problem
        self.conditions.append((time.monotonic(), doc["status"]["conditions"][0]))
        return 200, ""


def _shape(doc: Any) -> str | None:
    """What is wrong with a pods/status patch of one condition, or None."""
    if not isinstance(doc, dict) or set(doc) != {"status"} or set(doc["status"]) != {"conditions"}:
        return "the patch must touch status.conditions only"
    conditions = doc["status"]["conditions"]
    if not isinstance(conditions, list) or len(conditions) != 1:
        return "status.conditions: one condition expected"
    c = conditions[0]
    if not isinstance(c, dict) or set(c) != CONDITION_KEYS:
        return f"condition keys {sorted(c) if isinstance(c, dict) else c!r}"
    if c["type"] != "engine-watchdog.io/progressing" or c["status"] not in ("True", "False"):
        return f"condition type/status {c['type']!r}/{c['status']!r}"
    if not CAMEL.match(c["reason"]) or not isinstance(c["message"], str) or not c["message"]:
        return f"reason {c['reason']!r} is not CamelCase, or no message"
    if not RFC3339.match(c["lastTransitionTime"]):
        return f"lastTransitionTime {c['lastTransitionTime']!r} is not RFC 3339"
    return None


def pod_env(
    tmp: Path, api: FakeApi, cert: Path, token: str | None = None, **settings: str
) -> dict[str, str]:
    """The env a sidecar has in its pod, in-cluster (no API URL given): the API server's host
    and port, the service account's token and CA (moved by ENGINE_WATCHDOG_SERVICEACCOUNT_DIR),
    the downward API's pod, and ``settings`` as the chart's ConfigMap would set them. ``token``:
    what the token file holds, if not the token the API takes (one about to rotate)."""
    sa = tmp / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text((token or api.token) + "\n")
    (sa / "ca.crt").write_bytes(cert.read_bytes())
    return {
        **os.environ,
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api.port),
        "ENGINE_WATCHDOG_SERVICEACCOUNT_DIR": str(sa),
        "POD_NAME": api.pod,
        "POD_NAMESPACE": api.namespace,
        "POD_UID": "u-1",
        **settings,
    }
