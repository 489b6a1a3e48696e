"""The engine's own version, asked of it on every capture (vLLM and the simulator serve
``GET /version`` as ``{"version": "..."}``): a bundle from a pod whose log the watchdog cannot
read still names the release a maintainer asks for first.

Bounded: a stalled engine's API server may not answer at all, and the bundle must not wait.
"""

from __future__ import annotations

import aiohttp

from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.net.http import get_json

VERSION_TIMEOUT_S = 2.0
VERSION_CHARS = 80


async def read_engine_version(
    session: aiohttp.ClientSession, conn: EngineConnection, timeout_s: float = VERSION_TIMEOUT_S
) -> str | None:
    """The version the engine reports, through its one connection (TLS, credentials); None when
    it does not answer, answers something else, or has no /version (not every engine serves
    one)."""
    doc = await get_json(session, conn.url("/version"), timeout_s, conn.access)
    version = doc.get("version") if isinstance(doc, dict) else None
    if not isinstance(version, str) or not version.strip():
        return None
    return version.strip()[:VERSION_CHARS]
