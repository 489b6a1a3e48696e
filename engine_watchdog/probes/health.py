"""The health probe: the engine's own /health answer, as an observation (never a judgement:
vLLM answers 200 while its engine core hangs, and 503 only once it is known dead)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from engine_watchdog.core.model import HealthObs
from engine_watchdog.net.http import error_code


async def probe_health(
    session: aiohttp.ClientSession,
    url: str,
    timeout_s: float,
    clock: Callable[[], float] = time.time,
) -> HealthObs:
    t = clock()
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url, timeout=timeout) as resp:
            await resp.read()
            return HealthObs(t, status=resp.status)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return HealthObs(t, status=None, error=error_code(exc))
