"""The guard's client connections: a deadline for each request head, and a cap on the idle ones.

aiohttp's server has neither: a connection that sends nothing, half a head, or a head a byte
a second stays open for as long as the client likes (slowloris), each one a file descriptor
and a handler. Every accepted connection's protocol (aiohttp's request handler) is wrapped in
:class:`Conn`, which forwards every callback and watches two things:

- a head deadline: ``head_timeout_s`` from the accept, and from the first byte that comes
  after an answer, until the handler starts (aiohttp starts it once the head has been parsed);
  past it the connection gets 408 and is closed;
- the idle connections (no request under way), oldest first: past ``max_idle`` the oldest is
  closed.

The handler's start and end come from an aiohttp middleware (:meth:`Connections.middleware`).
Neither touches the path of a stream's bytes: those go out through the transport, not the
protocol. Each close is counted by reason (``engine_watchdog_guard_connections_closed_total``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

CLOSE_REASONS = ("head-timeout", "idle-cap")
TIMEOUT_ANSWER = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Conn(asyncio.Protocol):
    """One client connection: aiohttp's protocol inside, the deadline and idleness outside."""

    def __init__(self, owner: Connections, inner: asyncio.Protocol) -> None:
        self.owner = owner
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.busy = 0
        self.sent = False
        """Bytes arrived since the connection became idle (a head has begun)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.owner.by_transport[transport] = self
        self.inner.connection_made(transport)
        self._arm()
        self.owner.now_idle(self)

    def data_received(self, data: bytes) -> None:
        if not self.busy and not self.sent:
            self.sent = True
            if self.timer is None:
                self._arm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.owner.forget(self)
        self.inner.connection_lost(exc)

    def begin(self) -> None:
        """A request's handler starts: its head is in."""
        self.busy += 1
        self.sent = False
        self._disarm()
        self.owner.idle.pop(self, None)

    def end(self) -> None:
        self.busy -= 1
        if not self.busy and self.transport is not None and not self.transport.is_closing():
            self.owner.now_idle(self)

    def close(self, reason: str, answer: bytes = b"") -> None:
        self._disarm()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.owner.closed[reason] += 1
        if answer and isinstance(transport, asyncio.WriteTransport):
            transport.write(answer)
        transport.close()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.owner.head_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if not self.busy:
            self.close("head-timeout", TIMEOUT_ANSWER if self.sent else b"")


class Connections:
    """Every client connection of one guard; see the module's text."""

    def __init__(self, head_timeout_s: float, max_idle: int, closed: dict[str, int]) -> None:
        self.head_timeout_s = head_timeout_s
        self.max_idle = max_idle
        self.closed = closed
        """Closes by reason (:data:`CLOSE_REASONS`), the guard's stats' own dict."""
        self.by_transport: dict[asyncio.BaseTransport, Conn] = {}
        self.idle: dict[Conn, None] = {}
        """Idle connections, the longest idle first (a dict keeps insertion order)."""

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], Conn]:
        return lambda: Conn(self, inner())

    def now_idle(self, conn: Conn) -> None:
        self.idle[conn] = None
        while len(self.idle) > self.max_idle:
            oldest = next(iter(self.idle))
            self.idle.pop(oldest)
            oldest.close("idle-cap")

    def forget(self, conn: Conn) -> None:
        self.idle.pop(conn, None)
        if conn.transport is not None:
            self.by_transport.pop(conn.transport, None)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self.by_transport.get(request.transport) if request.transport else None
        if conn is None:
            return await handler(request)
        conn.begin()
        try:
            return await handler(request)
        finally:
            conn.end()

    async def listen(self, runner: web.AppRunner, host: str, port: int) -> asyncio.Server:
        """The guard's listening socket, every connection it accepts wrapped; in place of
        aiohttp's TCPSite (whose factory is aiohttp's own protocol)."""
        assert runner.server is not None
        loop = asyncio.get_running_loop()
        factory: Any = self.factory(runner.server)
        return await loop.create_server(factory, host, port, backlog=4096, reuse_address=True)
