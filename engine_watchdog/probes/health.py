"""The health probe: the engine's own /health answer, as an observation (never a judgement:
vLLM answers 200 while its engine core hangs, and 503 only once it is known dead)."""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp

from engine_watchdog.core.model import HealthObs
from engine_watchdog.net.access import OPEN, Access
from engine_watchdog.net.http import fetch

MAX_HEALTH_BYTES = 64 * 1024
"""vLLM's /health has an empty body; a long one is not an engine's (an endless body once took
the watchdog to 286 MB when it was read whole)."""


async def probe_health(
    session: aiohttp.ClientSession,
    url: str,
    timeout_s: float,
    clock: Callable[[], float] = time.time,
    access: Access = OPEN,
) -> HealthObs:
    t = clock()
    answer = await fetch(
        session, "GET", url, timeout_s=timeout_s, max_bytes=MAX_HEALTH_BYTES, access=access
    )
    if answer.error is not None:
        return HealthObs(t, status=None, error=answer.error)
    return HealthObs(t, status=answer.status)
