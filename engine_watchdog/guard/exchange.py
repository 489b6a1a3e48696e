"""One request through the guard, and what of its headers passes (plain data and helpers)."""

from __future__ import annotations

import asyncio
from typing import Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from engine_watchdog.guard.errors import Ending

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer"}
    | {"trailers", "transfer-encoding", "upgrade"}
)
"""RFC 9110 7.6.1: meaningful for one connection only, never forwarded."""
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect"}
"""Request headers the guard sets itself (the body is read whole before it is sent on)."""
SKIP_AUTO = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
"""Headers aiohttp would add on its own: a request carries only what its client sent."""
QUIET_S = 1.0
"""Streams quiet this long are listed one by one in the observation (the rest are counted)."""


class Closable(Protocol):
    """A request's connection to the engine (aiohttp's response, or the fast path's)."""

    def close(self) -> None: ...


class Exchange:
    """One request in flight and its progress (written on the hot path: slots, no methods)."""

    __slots__ = (
        "detail",
        "ending",
        "events",
        "first_event_t",
        "last_chunk",
        "last_event_t",
        "pump",
        "request_id",
        "response",
        "sse",
        "started_t",
        "upstream",
        "waiting_since",
    )

    def __init__(self, request_id: str, started_t: float) -> None:
        self.request_id = request_id
        self.started_t = started_t
        self.first_event_t: float | None = None
        self.last_event_t: float | None = None
        self.waiting_since: float | None = started_t
        self.events = 0
        self.sse = False
        self.last_chunk = b""
        self.ending: Ending | None = None
        self.detail = ""
        self.pump: asyncio.Task[web.StreamResponse] | None = None
        self.response: web.StreamResponse | None = None
        self.upstream: Closable | None = None


def forwarded(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in NOT_FORWARDED)


def returned(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


class DummyJar(aiohttp.DummyCookieJar):
    """No cookies kept between clients: each request carries only its own."""
