"""The guard's one data path to the engine (docs/guard.md, "The data path").

Every request goes to the engine on a connection of its own (TLS when the engine is https),
and its response is parsed by httptools (llhttp, the parser uvicorn uses) from the engine
connection's ``data_received`` callback: the body pieces of each read are noted (tokens, for
SSE) and written to the client's transport together, in the same callback. No task wakes up
per chunk, no stream reader or writer holds a copy. The request's coroutine sleeps until the
body ends, and wakes only when the client's buffer is full: the engine's socket is then paused
until the client's drains (back-pressure: a slow reader slows its own stream, and the guard
waits on it, not on the engine).

Each read's tokens are counted by the stream's Progress (guard/scan.py: compiled where a C
compiler built it). A chunked stream whose read left the parser between two chunks (llhttp's
``on_chunk_complete`` came last, and the read ended with it) goes to the relay thread
(guard/lanes.py) until a read is not whole chunks. guard/relay.py drives each request over
this path, from its connection to its end.

One connection per request is also what makes an abort exact: closing it is what vLLM takes as
that request's client gone (``@with_cancellation``), whatever ids the clients sent.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import httptools
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from engine_watchdog.guard.exchange import Exchange
from engine_watchdog.guard.held import Held, pending
from engine_watchdog.guard.lanes import Lanes
from engine_watchdog.guard.stats import GuardStats

if TYPE_CHECKING:
    from engine_watchdog.guard._relay import Lane

COOL_MAX = 64
"""The most reads a stream the relay thread handed back waits before it goes again."""
NO_BODY_STATUS = frozenset({204, 304})
"""RFC 9112 6.3: these responses (and every 1xx) have no body, whatever their headers say."""


class UpstreamError(Exception):
    """The engine's side of a request failed; the message is the client's."""


class NotListening(UpstreamError):
    """Nothing accepts connections at the engine's address (a restart, a crash)."""


class OutOfDescriptors(UpstreamError):
    """The guard has no file descriptor left for a connection to the engine (its own limit)."""


class Client:
    """Where a relayed body goes: the client's connection and its request's progress (plain
    data: :meth:`EngineSide._pass_on` reads it)."""

    __slots__ = ("clock", "ex", "framed", "high", "lanes", "stats", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        ex: Exchange,
        stats: GuardStats | None,
        framed: bool,
        clock: Callable[[], float],
        lanes: Lanes | None = None,
    ) -> None:
        self.transport = transport
        self.ex = ex
        self.stats = stats
        """Where an SSE stream's progress is noted (:meth:`GuardStats.note`); None otherwise."""
        self.framed = framed
        self.clock = clock
        self.high = transport.get_write_buffer_limits()[1]
        self.lanes = lanes
        """The relay thread its stream may be handed to; None: never."""


class EngineSide(asyncio.Protocol):
    """One request's connection to the engine: httptools reads the response head, then the
    body pieces of each read are passed on together at its end (:meth:`relay`): one note and
    one write per read of the engine's socket, however many chunks it held."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.transport: asyncio.Transport | None = None
        self._ready: list[bytes] = []
        self.on_body = self._ready.append  # (a C call from llhttp's callback: no Python frame)
        self.parser = httptools.HttpResponseParser(self)
        self._feed = self.parser.feed_data
        self._client: Client | None = None
        self.failure: BaseException | None = None
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.done = False
        self._client_full = False
        self._wake: asyncio.Future[None] | None = None
        self.lane: Lane | None = None
        """Set while the stream's reads are the relay thread's."""
        self._adopting = True
        """Offer the stream to the thread after a read that ends between chunks."""
        self._between = False
        """The parser is between two chunks: llhttp's on_chunk_complete came after the last
        on_chunk_header."""
        self._cool = 0
        self._returns = 0
        self._read_error: OSError | None = None
        """Why the thread's last read of the engine failed (a reset): the loop sees the end."""

    # -- the engine connection's callbacks --------------------------------------------------

    def data_received(self, data: bytes) -> None:
        try:
            self._feed(data)
        except (httptools.HttpParserUpgrade, httptools.HttpParserError) as exc:
            self._parse_failed(exc)
            return
        if self._ready and self._client is not None and self.failure is None:
            self._pass_on()
            # Between chunks, and nothing of the next one read: its size line would have ended
            # in CRLF and called on_chunk_header (guard/relay_thread.c at_boundary, the same).
            if self._between and self._adopting and data[-2:] == b"\r\n":
                self._adopt()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (not an isinstance check: uvloop's transports have the methods, not the base class)
        self.transport = cast(asyncio.Transport, transport)

    def _parse_failed(self, exc: Exception) -> None:
        if isinstance(exc, httptools.HttpParserUpgrade):
            self._fail(UpstreamError("it switched protocols, which the guard does not pass"))
        else:
            self._fail(UpstreamError(f"its response is not HTTP/1.1 the guard passes: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._adopting = False
        taken = self._take_back_now() if self.lane is not None else None
        if taken is not None and taken[0] and not taken[1]:
            self.data_received(taken[0])  # its last read, handed back: maybe the response's end
        exc = exc or self._read_error
        framed = "Content-Length" in self.headers or "Transfer-Encoding" in self.headers
        if exc is None and self.head.done() and not framed:
            self.done = True  # no length, no chunks: the body ended with the connection
        elif not self.done:
            why = f": {exc}" if exc else ""
            self._fail(UpstreamError(f"it closed the connection before its response ended{why}"))
        self._poke()

    # -- httptools' callbacks (on_body is the list's append: __init__) -----------------------

    def on_status(self, reason: bytes) -> None:
        self.reason = reason.decode("latin-1")

    def on_chunk_header(self) -> None:
        self._between = False

    def on_chunk_complete(self) -> None:
        self._between = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:
            self.headers = CIMultiDict()  # an interim answer (100): the real one follows
            return
        assert self.transport is not None
        self.transport.pause_reading()  # until the relay starts
        if self.method == "HEAD" or self.status in NO_BODY_STATUS:
            self.done = True  # llhttp is not told the method: the head is the whole answer
        self.head.set_result(None)

    def _pass_on(self) -> None:
        """The pieces ready as one piece: one note (the stream's reader takes events across
        pieces anyway) and one write, however many chunks the engine's read held."""
        ready, client = self._ready, cast(Client, self._client)
        assert client is not None
        piece = ready[0] if len(ready) == 1 else b"".join(ready)
        ready.clear()
        transport, ex = client.transport, client.ex
        if transport.is_closing():
            self._fail(ConnectionResetError("the client went away"))
            return
        now = ex.moved_t = client.clock()
        if client.stats is not None:
            client.stats.note(ex, piece, now)
        transport.write(b"%x\r\n%b\r\n" % (len(piece), piece) if client.framed else piece)
        if ex.waiting_since is None:  # (only after the client held it: see below)
            ex.waiting_since = now
        # else unchanged: bytes without a token (keepalives, empty deltas) are no progress, and
        # the guard has been waiting on the engine for a token all along (case 2)
        if transport.get_write_buffer_size() > client.high:
            self._hold()

    def _hold(self) -> None:
        """The client's buffer is over its high-water mark (the transport has paused aiohttp's
        writer: drain() waits for it): the engine waits for the client."""
        assert self.transport is not None and self._client is not None
        self.transport.pause_reading()
        self._client.ex.waiting_since = None  # on the client now: a slow reader holds its own
        self._client_full = True
        self._poke()

    def on_message_complete(self) -> None:
        if self.head.done():
            self.done = True
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
        if self._ready:
            self._pass_on()
        while self.failure is None and not self.done:
            if self._client_full:
                await writer.drain()
                self._client_full = False
                client.ex.waiting_since = client.ex.moved_t = client.clock()
            assert self.transport is not None
            if self.lane is None:  # (on the thread: it reads the engine's socket)
                self.transport.resume_reading()
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        """Close the engine's connection (the engine takes it as the client gone)."""
        if self.lane is not None:
            self._take_back_now()
        if not self.head.done():
            self.head.cancel()
        if self.transport is not None:
            self.transport.close()

    # -- the relay thread (guard/lanes.py) -------------------------------------------------

    def _adopt(self) -> None:
        """After a read that left the parser between chunks: offer the stream to the relay
        thread (after a cool-down if it came back before)."""
        if self._cool:
            self._cool -= 1
            return
        client = self._client
        if client is None or client.lanes is None:
            self.never_adopt()
            return
        client.lanes.adopt(self, client)

    def never_adopt(self) -> None:
        self._adopting = False

    def taken_back(self) -> None:
        """The thread handed the stream back: what it left is done here, in order."""
        client = self._client
        assert client is not None and self.transport is not None
        self._returns += 1
        self._cool = min(2**self._returns, COOL_MAX)
        taken = self._take_back_now()
        if taken is None:
            self._fail(UpstreamError("the guard ran out of memory relaying it"))
            return
        back, unsent = taken
        if unsent and client.transport.is_closing():
            self._fail(ConnectionResetError("the client went away"))
            return
        self.transport.resume_reading()
        if unsent and client.transport.get_write_buffer_size() > client.high:
            self._hold()
        elif back and not unsent:
            self.data_received(back)  # the read the thread did not serve, as if just read

    def _take_back_now(self) -> tuple[bytes, bool] | None:
        """The stream back from the thread, before the client is written to or the engine's
        connection closed: the rest of the thread's last write is written first. What came
        back with it (bytes, whether they were that rest); None where it was lost (memory)."""
        client = self._client
        assert client is not None and client.lanes is not None
        try:
            back, unsent, err = client.lanes.release(self)
        except MemoryError:
            return None
        if err:  # (OSError picks the subclass: ConnectionResetError for ECONNRESET)
            self._read_error = OSError(err, os.strerror(err))
        if unsent and not client.transport.is_closing():
            client.transport.write(back)  # before anything else
        return back, unsent

    # -- the guard's self-check (guard/held.py) --------------------------------------------

    def held(self) -> Held:
        client, transport = self._client, self.transport
        queued = 0
        if client is not None and not client.transport.is_closing():
            queued = client.transport.get_write_buffer_size()
        waiting = -1
        if transport is not None and not transport.is_closing():
            sock = transport.get_extra_info("socket")
            waiting = pending(sock.fileno()) if sock is not None else -1
        reading = self.lane is not None or (transport is not None and transport.is_reading())
        return Held(self.lane is not None, reading, waiting, queued)

    def unstick(self) -> None:
        """After a self-check violation: the stream back from the thread, its engine socket
        read again (unless its client is full), its task woken."""
        if self.failure is not None or self.done or self._client is None:
            return
        if self.lane is not None:
            self.taken_back()
        elif not self._client_full and self.transport is not None:
            self.transport.resume_reading()
        self._poke()

    def broke(self, exc: Exception) -> None:
        """Taking the stream back from the thread failed: this request ends, as a read
        callback's error ends its connection."""
        self._fail(UpstreamError(f"the guard failed relaying it: {exc!r}"))
