"""The one way the watchdog talks to the Kubernetes API server: its own pod (downward API), the
service account's token and CA, one bounded request. No client library: a POST for Events, a
PATCH of the pod's status for the readiness gate, a bounded GET of a container's log.

In-cluster, the API server comes from KUBERNETES_SERVICE_HOST/PORT and the credentials from the
projected service-account volume (ENGINE_WATCHDOG_SERVICEACCOUNT_DIR moves it: a volume of one's
own, or a test's loopback stand-in).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from engine_watchdog.core.settings import SettingsError
from engine_watchdog.net.http import error_text

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SA_DIR_ENV = "ENGINE_WATCHDOG_SERVICEACCOUNT_DIR"
TYPICAL_LINE_BYTES = 120
MIN_TAIL_LINES = 100
LOG_READ_FACTOR = 4
"""A container log is read to at most this many times the bundle's log limit."""


class ApiError(RuntimeError):
    """The API server answered, and not with a 2xx (the message has the status, never the token)."""


@dataclass(frozen=True)
class PodRef:
    api: str
    """API server base URL."""
    namespace: str
    name: str
    uid: str
    token_file: Path | None = SA_DIR / "token"
    ca_file: Path | None = SA_DIR / "ca.crt"


def pod_from_env(
    api: str | None = None,
    env: dict[str, str] | None = None,
    flag: str = "--k8s-events",
    component: str = "events-rbac",
) -> PodRef:
    """The pod this watchdog runs in; ValueError naming what is missing. ``api`` overrides the
    in-cluster API server (e.g. http://127.0.0.1:8001 behind ``kubectl proxy``)."""
    env = dict(os.environ if env is None else env)
    needed = ("POD_NAME", "POD_NAMESPACE") + (() if api else ("KUBERNETES_SERVICE_HOST",))
    missing = [k for k in needed if not env.get(k)]
    if missing:
        raise ValueError(f"{flag} needs {', '.join(missing)} (the {component} component sets them)")
    if not api:
        host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
        api = f"https://{host}:{port}"
    sa = Path(env.get(SA_DIR_ENV) or SA_DIR)
    return PodRef(
        api.rstrip("/"),
        env["POD_NAMESPACE"],
        env["POD_NAME"],
        env.get("POD_UID", ""),
        token_file=sa / "token",
        ca_file=sa / "ca.crt",
    )


def pod_for(where: str, flag: str, component: str) -> PodRef:
    """An option's value ('in-cluster' or an API URL) as the pod: a SettingsError naming the
    option and what is missing (at start, not at the first stall)."""
    try:
        api = None if where == "in-cluster" else where
        return pod_from_env(api, flag=flag, component=component)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


async def call(
    session: aiohttp.ClientSession,
    pod: PodRef,
    method: str,
    path: str,
    body: dict[str, Any],
    content_type: str = "application/json",
    timeout_s: float = 5.0,
) -> None:
    """One request to the API server, bounded by ``timeout_s`` in all (connect, TLS, answer);
    raises ApiError on a non-2xx answer, aiohttp/OS/timeout errors as they come."""
    headers = {"Content-Type": content_type, **await _auth(pod)}
    url = pod.api + path
    ctx: ssl.SSLContext | bool = _tls(pod.ca_file) if url.startswith("https") else True
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    data = json.dumps(body).encode()
    async with session.request(
        method, url, data=data, headers=headers, ssl=ctx, timeout=timeout
    ) as r:
        if r.status // 100 != 2:
            raise ApiError(f"HTTP {r.status}: {await error_text(r)}")


async def read_log(
    session: aiohttp.ClientSession,
    pod: PodRef,
    container: str,
    limit_bytes: int,
    timeout_s: float = 10.0,
) -> bytes:
    """The last ``limit_bytes`` at most of a container's log in this pod. The API's limitBytes
    counts from the start of what it sends, so it is asked for the last lines (tailLines, about
    ``limit_bytes`` of them at typical lengths), capped at a few times the limit, and the end of
    that is kept. Raises ApiError on a non-2xx answer (403: no get on pods/log in the Role)."""
    cap = LOG_READ_FACTOR * limit_bytes
    tail_lines = max(MIN_TAIL_LINES, limit_bytes // TYPICAL_LINE_BYTES)
    query = {"container": container, "tailLines": str(tail_lines), "limitBytes": str(cap)}
    url = f"{pod.api}/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/log"
    ctx: ssl.SSLContext | bool = _tls(pod.ca_file) if url.startswith("https") else True
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(
        url, params=query, headers=await _auth(pod), ssl=ctx, timeout=timeout
    ) as r:
        if r.status // 100 != 2:
            raise ApiError(f"HTTP {r.status}: {await error_text(r)}")
        body = bytearray()
        async for chunk in r.content.iter_chunked(1 << 16):
            body += chunk[: cap - len(body)]
            if len(body) >= cap:
                break
    return bytes(body[-limit_bytes:])


async def _auth(pod: PodRef) -> dict[str, str]:
    if pod.token_file is None or not pod.token_file.exists():
        return {}
    # Projected tokens rotate (kubelet rewrites the file): read it for every request.
    token = await asyncio.to_thread(pod.token_file.read_text)
    return {"Authorization": f"Bearer {token.strip()}"}


def _tls(ca_file: Path | None) -> ssl.SSLContext:
    if ca_file is not None and ca_file.exists():
        return ssl.create_default_context(cafile=str(ca_file))
    return ssl.create_default_context()
