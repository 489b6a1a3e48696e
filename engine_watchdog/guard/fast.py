"""The guard's fast path for streams (docs/guard.md, "The fast path").

A streaming request goes to the engine on a connection of its own, and its response body is
passed to the client from the engine connection's ``data_received`` callback: decoded from its
framing (guard/http1.py), noted (SSE events, as the aiohttp path notes them), written to the
client's transport as one chunk, in the same callback. No task wakes up per chunk, no stream
reader or writer holds a copy. The coroutine of the request sleeps until the body ends, and
wakes only when the client's buffer is full: the engine's socket is then paused until the
client's drains (back-pressure: a slow reader slows its own stream, and the guard waits on it,
not on the engine).

Everything else (and every request when the engine is not plain ``http://``) takes the aiohttp
path in guard/proxy.py.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict
from yarl import URL

from engine_watchdog.guard.exchange import Exchange, returned
from engine_watchdog.guard.http1 import (
    MAX_HEAD_BYTES,
    BadFraming,
    Body,
    Chunked,
    Head,
    Sized,
    body_of,
    frame,
    parse_head,
    request_head,
)

Note = Callable[[Exchange, bytes, float], None]
"""The guard's per-chunk progress note of an SSE stream (Guard.note)."""
STREAM_FLAG = re.compile(rb'"stream"\s*:\s*true')
"""An OpenAI request asking for a stream. Only a guess that picks the path: the response's
Content-Type decides whether it is read as SSE, and the fast path passes any response."""


class UpstreamError(Exception):
    """The engine's side of a fast-path request failed; the message is the client's."""


class NotListening(UpstreamError):
    """Nothing accepts connections at the engine's address (a restart, a crash)."""


@dataclass(frozen=True)
class Target:
    """Where the fast path connects: a plain ``http://`` engine (anything else: aiohttp)."""

    host: str
    port: int
    authority: str
    """The Host header."""
    base: str
    """The engine URL's path, put before every request's."""

    @classmethod
    def of(cls, upstream: str) -> Target | None:
        url = URL(upstream)
        if url.scheme != "http" or not url.raw_host or url.raw_user or url.raw_query_string:
            return None
        return cls(url.raw_host, url.port or 80, url.raw_authority, url.raw_path.rstrip("/"))


def wants_stream(request: web.Request, body: bytes) -> bool:
    """A streaming request from an HTTP/1.1 client (chunked answers need 1.1)."""
    return (
        request.method == "POST"
        and request.version == HttpVersion11
        and STREAM_FLAG.search(body) is not None
    )


class Client:
    """Where a relayed body goes: the client's connection and its request's progress."""

    __slots__ = ("clock", "ex", "framed", "high", "note", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        ex: Exchange,
        note: Note | None,
        framed: bool,
        clock: Callable[[], float],
    ) -> None:
        self.transport = transport
        self.ex = ex
        self.note = note
        self.framed = framed
        self.clock = clock
        self.high = transport.get_write_buffer_limits()[1]

    def put(self, piece: bytes, chunk: bytes | None = None) -> bool:
        """Note one piece and write it at once (``chunk``: the piece already framed as one
        chunk, as the engine sent it); True when the client's buffer went over its high-water
        mark (the transport has paused aiohttp's writer: drain() waits for it)."""
        now = self.clock()
        if self.note is not None:
            self.note(self.ex, piece, now)
        if chunk is None:
            chunk = frame(piece) if self.framed else piece
        self.transport.write(chunk)
        self.ex.waiting_since = now  # waiting on the engine again
        return self.transport.get_write_buffer_size() > self.high


class Upstream(asyncio.Protocol):
    """One fast-path request's connection to the engine: reads the response head, then
    passes every piece of the body on from its callback (:meth:`relay`)."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.transport: asyncio.Transport | None = None
        self.head: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self.body = Body()
        """The body's framing, known with the head."""
        self.failure: BaseException | None = None
        self._buffer = b""
        """The head until it is complete."""
        self._early: list[bytes] = []
        """Body bytes that came before the relay started (the engine is paused meanwhile)."""
        self._client: Client | None = None
        self._client_full = False
        self._chunks: Chunked | None = None
        """A chunked body's decoder, once its relay started: its whole chunks pass as they
        came (the client's body is chunked too)."""
        self._wake: asyncio.Future[None] | None = None

    # -- the engine's callbacks (the hot path) -----------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (not an isinstance check: uvloop's transports have the methods, not the base class)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._chunks is not None:
            piece = self._chunks.one_chunk(data)
            if piece is not None:  # the hot path: one event, one chunk, passed as it came
                self._forward(piece, data)
                return
        try:
            if not self.head.done():
                data = self._read_head(data)
                if not self.head.done():
                    return
            piece = self.body.feed(data)
        except BadFraming as exc:
            self._fail(UpstreamError(f"its response is not HTTP/1.1 the guard passes: {exc}"))
            return
        if piece:
            self._forward(piece)
        if self.body.done:
            self._poke()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.body.ends_at_close and exc is None and self.head.done():
            self.body.done = True
        elif not self.body.done:
            why = f": {exc}" if exc else ""
            self._fail(UpstreamError(f"it closed the connection before its response ended{why}"))
        self._poke()

    def _read_head(self, data: bytes) -> bytes:
        """Collect the head; once complete, the engine is paused until the relay starts, and
        what followed the head is returned. (1xx interim answers are skipped.)"""
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            head, data = parse_head(self._buffer[:end]), self._buffer[end + 4 :]
            self._buffer = data
            if head.status >= 200:
                self.body = body_of(head, self.method)
                assert self.transport is not None
                self.transport.pause_reading()
                self.head.set_result(head)
                return data
        if len(self._buffer) > MAX_HEAD_BYTES:
            raise BadFraming(f"a response head over {MAX_HEAD_BYTES} bytes")
        return b""

    def _forward(self, piece: bytes, chunk: bytes | None = None) -> None:
        client = self._client
        if client is None:
            self._early.append(piece)
        elif client.transport.is_closing():
            self._fail(ConnectionResetError("the client went away"))
        elif client.put(piece, chunk):
            assert self.transport is not None
            self.transport.pause_reading()
            client.ex.waiting_since = None  # on the client now: a slow reader holds its own
            self._client_full = True
            self._poke()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        if not self.head.done():
            self.head.set_exception(exc)
        self.close()
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # -- the request's coroutine ------------------------------------------------------------

    async def relay(self, client: Client, writer: AbstractStreamWriter) -> None:
        """Pass the body to ``client`` until it ends; raises what ended it otherwise."""
        self._client = client
        if isinstance(self.body, Chunked):
            self._chunks = self.body
        for piece in self._early:
            self._forward(piece)
        self._early.clear()
        while self.failure is None and not self.body.done:
            if self._client_full:
                await writer.drain()
                self._client_full = False
                client.ex.waiting_since = client.clock()
            assert self.transport is not None
            self.transport.resume_reading()
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        """Close the engine's connection (the engine takes it as the client gone)."""
        if not self.head.done():
            self.head.cancel()
        if self.transport is not None:
            self.transport.close()


class FastPath:
    """The fast path to one engine (the guard's, when the engine is plain ``http://``)."""

    def __init__(
        self, target: Target, note: Note, clock: Callable[[], float], timeout_s: float
    ) -> None:
        self.target = target
        self.note = note
        self.clock = clock
        self.timeout_s = timeout_s

    async def pump(
        self, request: web.Request, ex: Exchange, headers: CIMultiDict[str], body: bytes
    ) -> web.StreamResponse:
        """One request, from its connection to the engine to its response's end."""
        up = await connect(self.target, request.method, self.timeout_s)
        ex.upstream = up
        try:
            assert up.transport is not None and request.transport is not None
            path, host = self.target.base + request.raw_path, self.target.authority
            up.transport.write(request_head(request.method, path, host, headers, len(body)))
            up.transport.write(body)
            head = await up.head
            resp = web.StreamResponse(status=head.status, reason=head.reason)
            resp.headers.extend(returned(head.headers))
            ex.sse = head.headers.get("Content-Type", "").startswith("text/event-stream")
            framed = ex.sse or not isinstance(up.body, Sized)
            if framed:  # chunked to the client: an error event can always follow what came
                resp.headers.popall("Content-Length", None)
            writer = await resp.prepare(request)
            assert writer is not None
            ex.response = resp
            note = self.note if ex.sse else None
            await up.relay(Client(request.transport, ex, note, framed, self.clock), writer)
            await resp.write_eof()
            return resp
        finally:
            up.close()


async def connect(target: Target, method: str, timeout_s: float) -> Upstream:
    loop = asyncio.get_running_loop()
    try:
        _, up = await asyncio.wait_for(
            loop.create_connection(lambda: Upstream(method), target.host, target.port), timeout_s
        )
    except asyncio.TimeoutError as exc:  # (before OSError: on 3.11 it is one)
        raise UpstreamError(f"no connection within {timeout_s:g} s") from exc
    except OSError as exc:
        raise NotListening(str(exc)) from exc
    return up
