"""The engine container's log on Kubernetes, read through the API's pods/log (``--pod-log``).

A sidecar cannot read another container's stdout from its own file system; the API server can
serve it, when the watchdog's Role grants ``get`` on ``pods/log`` (the pod-log component, the
chart's ``podLog``). Bounded in size (the capture's log_tail_bytes) and in time: a slow or
refusing API server costs the bundle one line saying so, never the bundle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp

from engine_watchdog.net.k8s_api import ApiError, PodRef, read_log

POD_LOG_TIMEOUT_S = 10.0
FIX_FORBIDDEN = "grant get on pods/log to the watchdog's ServiceAccount (the pod-log component)"


def pod_log_reader(
    session: aiohttp.ClientSession, pod: PodRef, container: str, limit_bytes: int
) -> Callable[[], Awaitable[bytes]]:
    """What the bundle writer calls, beside the steps, for engine.log."""

    async def read() -> bytes:
        return await read_pod_log(session, pod, container, limit_bytes)

    return read


async def read_pod_log(
    session: aiohttp.ClientSession,
    pod: PodRef,
    container: str,
    limit_bytes: int,
    timeout_s: float = POD_LOG_TIMEOUT_S,
) -> bytes:
    """The log's last ``limit_bytes``, or one ``[engine-watchdog]`` line saying why not."""
    where = f"container {container} of pod {pod.namespace}/{pod.name}"
    try:
        return await read_log(session, pod, container, limit_bytes, timeout_s)
    except ApiError as e:
        fix = f": {FIX_FORBIDDEN}" if str(e).startswith("HTTP 403") else ""
        return f"[engine-watchdog] the API did not give the log of {where}: {e}{fix}\n".encode()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        why = str(e) or type(e).__name__  # a timeout's text is empty
        return f"[engine-watchdog] could not read the log of {where}: {why}\n".encode()
