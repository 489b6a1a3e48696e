"""One request through the guard, and what of its headers passes (plain data and helpers)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from engine_watchdog.guard.answers import Ending
from engine_watchdog.guard.scan import Progress

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer"}
    | {"trailers", "transfer-encoding", "upgrade"}
)
"""RFC 9110 7.6.1: meaningful for one connection only, never forwarded."""
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect"}
"""Request headers the guard sets itself (the body is read whole before it is sent on)."""
QUIET_S = 1.0
"""Streams quiet this long are listed one by one in the observation (the rest are counted)."""


class Closable(Protocol):
    """A request's connection to the engine (guard/fast.py)."""

    def close(self) -> None: ...


class Exchange:
    """One request in flight and its progress (written on the hot path: slots, no methods)."""

    __slots__ = (
        "detail",
        "ended_t",
        "ending",
        "engine_id",
        "events",
        "first_event_t",
        "key",
        "label",
        "last_event_t",
        "moved_t",
        "progress",
        "pump",
        "response",
        "self_checked",
        "sse",
        "started_t",
        "upstream",
        "waiting_since",
    )

    def __init__(self, key: str, label: str, started_t: float, progress: Progress) -> None:
        self.key = key
        """The guard's own id of this request: what the judge names and the supervisor ends."""
        self.label = label
        """The client's X-Request-Id, if it sent one: only a label (two clients may share it)."""
        self.engine_id = ""
        """The engine's id of the request, from its first token event (for the log)."""
        self.started_t = started_t
        self.first_event_t: float | None = None
        self.last_event_t: float | None = None
        self.waiting_since: float | None = started_t
        self.events = 0
        """Events that carried generated content (guard/scan.py)."""
        self.sse = False
        self.progress = progress
        """The stream's event-stream reader and token rule (guard/scan.py)."""
        self.ending: Ending | None = None
        self.ended_t: float | None = None
        """When the guard was ordered to end it."""
        self.moved_t = started_t
        """When a read of its response last reached its client, or its client drained."""
        self.self_checked = False
        """The guard's self-check found it breaking the promise (guard/held.py): said once."""
        self.detail = ""
        self.pump: asyncio.Task[web.StreamResponse] | None = None
        self.response: web.StreamResponse | None = None
        self.upstream: Closable | None = None


def forwarded(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in NOT_FORWARDED)


def returned(headers: CIMultiDict[str] | CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)
