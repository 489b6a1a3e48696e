"""The one HTTP helper that probes, recovery and reporters share.

Every read is bounded: a body is read to its end against a running byte cap, and a body that
passes the cap is an error (``too-large``), never a truncated answer. (aiohttp's
``resp.content.read(n)`` returns what happens to be buffered, not the body: a /metrics answer
sent in small chunks was cut after its first chunk.) Nothing here raises for a bad answer:
every request ends as an :class:`Answer`, which may carry an error code (net/failures.py) and
one line for humans. Nothing here judges an answer either.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from engine_watchdog.core.model import Cause
from engine_watchdog.core.redact import redact_url
from engine_watchdog.net.access import OPEN, Access
from engine_watchdog.net.failures import TOO_LARGE, BodyTooLarge, describe, error_code

ERROR_TEXT_BYTES = 200
"""How much of an answer's body an error message quotes."""
MAX_ANSWER_BYTES = 1 << 20
"""Cap of small JSON answers (/v1/models, a 1-token completion, abort, is_paused): 1 MiB holds
thousands of models; a body past it is not an answer of the engine we know."""
CHUNK_BYTES = 64 * 1024

# What a request can raise that is the server's doing, not ours: aiohttp's errors (TLS, payload,
# bad headers), timeouts, sockets, and ValueError (ssl.CertificateError is one; so are
# malformed URLs and header values).
NET_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


@dataclass(frozen=True)
class Answer:
    """What one request got: a status and the whole body, or an error code and why."""

    status: int | None
    body: bytes = b""
    error: Cause | None = None
    """timeout, connection-refused, tls, too-large, disconnected, http-error (net/failures.py)."""
    detail: str | None = None
    """One line: the URL, what happened, and for TLS and size the fix."""
    elapsed_s: float = 0.0

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON; None when it is not JSON (bad bytes, bad syntax, absurd depth)."""
        return parse_json(self.body)


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


async def read_body(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The whole body, or :class:`BodyTooLarge` as soon as it passes ``max_bytes`` (never more
    than the cap and one chunk in memory, whatever the server sends or declares)."""
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise BodyTooLarge(f"the answer declares {declared} bytes, over the {max_bytes}-byte cap")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
        if len(body) + len(chunk) > max_bytes:
            raise BodyTooLarge(f"the answer is larger than the {max_bytes}-byte cap")
        body += chunk
    return bytes(body)


async def fetch(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int = MAX_ANSWER_BYTES,
    access: Access = OPEN,
    json_body: Any = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One request to an engine, read whole against ``max_bytes``; never raises for anything
    the server does (cancellation still propagates)."""
    started = time.monotonic()
    sent = {**access.headers(urlsplit(url).path), **(headers or {})}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.request(
            method, url, json=json_body, headers=sent, timeout=timeout, ssl=access.ssl_arg
        ) as resp:
            try:
                body = await read_body(resp, max_bytes)
            except BodyTooLarge as exc:
                detail = redact_url(f"{url}: {TOO_LARGE} ({exc})")
                return Answer(
                    resp.status, error=TOO_LARGE, detail=detail, elapsed_s=_since(started)
                )
            return Answer(resp.status, body, elapsed_s=_since(started))
    except NET_ERRORS as exc:
        # The URL may hold credentials (only to connect): a detail reaches traces and logs.
        detail = redact_url(f"{url}: {describe(exc, timeout_s)}")
        return Answer(None, error=error_code(exc), detail=detail, elapsed_s=_since(started))


def _since(started: float) -> float:
    return time.monotonic() - started


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    timeout_s: float,
    access: Access = OPEN,
) -> tuple[int | None, str]:
    """(status, the start of the answer) or (None, an error code)."""
    answer = await fetch(session, "POST", url, timeout_s=timeout_s, access=access, json_body=body)
    if answer.status is None or answer.error is not None:
        return None, answer.error or Cause.NO_ANSWER
    return answer.status, answer.text()[:ERROR_TEXT_BYTES]


async def get_json(
    session: aiohttp.ClientSession, url: str, timeout_s: float, access: Access = OPEN
) -> Any:
    """The JSON document a GET answers with 200, or None for anything else."""
    answer = await fetch(session, "GET", url, timeout_s=timeout_s, access=access)
    return answer.json() if answer.status == 200 and answer.error is None else None


async def error_text(resp: aiohttp.ClientResponse, limit: int = ERROR_TEXT_BYTES) -> str:
    """The start of an error answer for a message (reads at most ``limit`` bytes of it)."""
    try:
        start = await resp.content.read(limit)
    except NET_ERRORS:
        return ""
    return start.decode("utf-8", errors="replace")
