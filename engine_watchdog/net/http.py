"""The one HTTP helper that probes, recovery and reporters share: short error codes for failed
requests, and small bounded JSON calls. Nothing here judges an answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

ERROR_TEXT_BYTES = 200
"""How much of an answer's body an error message quotes."""


def error_code(exc: BaseException) -> str:
    """A short, stable code for an HTTP failure (used in verdicts, metrics and traces)."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connection-refused"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected"
    return "http-error"


async def post_json(
    session: aiohttp.ClientSession, url: str, body: dict[str, object], timeout_s: float
) -> tuple[int | None, str]:
    """(status, the start of the answer) or (None, an error code)."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(url, json=body, timeout=timeout) as resp:
            return resp.status, (await resp.text())[:ERROR_TEXT_BYTES]
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return None, error_code(exc)


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float) -> Any:
    """The JSON document a GET answers with 200, or None for anything else."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                return None
            return json.loads(await resp.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
