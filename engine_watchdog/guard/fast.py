"""The guard's one data path to the engine (docs/guard.md, "The data path").

Every request goes to the engine on a connection of its own (TLS when the engine is https),
and its response is parsed by httptools (llhttp, the parser uvicorn uses) from the engine
connection's ``data_received`` callback: the body pieces of each read are noted (tokens, for
SSE) and written to the client's transport together, in the same callback. No task wakes up
per chunk, no stream reader or writer holds a copy. The request's coroutine sleeps until the
body ends, and wakes only when the client's buffer is full: the engine's socket is then paused
until the client's drains (back-pressure: a slow reader slows its own stream, and the guard
waits on it, not on the engine).

The read's callback, ``data_received``, is compiled where the package was built with a C
compiler (guard/side.py, guard/_side.c): it then runs a stream's steady event without the
interpreter, and everything else through :meth:`EngineSide._pass_on` here. A stream whose
reads are steady then goes to the relay thread (guard/lanes.py) until one is not.
guard/relay.py drives each request over this path, from its connection to its end.

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
from engine_watchdog.guard.lanes import Lanes
from engine_watchdog.guard.side import Side
from engine_watchdog.guard.stats import GuardStats

if TYPE_CHECKING:
    from engine_watchdog.guard._lane import Lane

COOL_MAX = 64
"""The most steady events a stream the relay thread handed back waits before it goes again."""
NO_BODY_STATUS = frozenset({204, 304})
"""RFC 9112 6.3: these responses (and every 1xx) have no body, whatever their headers say."""


class UpstreamError(Exception):
    """The engine's side of a request failed; the message is the client's."""


class NotListening(UpstreamError):
    """Nothing accepts connections at the engine's address (a restart, a crash)."""


class Client:
    """Where a relayed body goes: the client's connection and its request's progress (plain
    data: :meth:`EngineSide._pass_on` and guard/_side.c read it)."""

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
        """The steady relay its stream may be handed to (guard/lanes.py); None: never."""


class EngineSide(Side, asyncio.Protocol):
    """One request's connection to the engine: httptools reads the response head, then the
    body pieces of each read are passed on together at its end (:meth:`relay`): one note and
    one write per read of the engine's socket, however many chunks it held. ``data_received``
    is guard/side.py's."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.transport: asyncio.Transport | None = None
        self._ready = []
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
        """Set while the stream's steady reads are the relay thread's (guard/lanes.py)."""
        self._adopting = True  # (read by guard/_side.c: offer the stream to the thread)
        self._cool = 0
        self._returns = 0
        self._read_error: OSError | None = None
        """Why the thread's last read of the engine failed (a reset): the loop sees the end."""

    # -- the engine connection's callbacks --------------------------------------------------

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
        """The pieces ready as one piece: one note (the token scan cuts events across pieces
        anyway) and one write, however many chunks the engine's read held. The hot path: its
        steady event runs in guard/_side.c where that is built; change both together."""
        ready, client = self._ready, cast(Client, self._client)
        assert client is not None
        piece = ready[0] if len(ready) == 1 else b"".join(ready)
        ready.clear()
        transport, ex = client.transport, client.ex
        if transport.is_closing():
            self._fail(ConnectionResetError("the client went away"))
            return
        now = client.clock()
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
                client.ex.waiting_since = client.clock()
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

    # -- the steady relay (guard/lanes.py) --------------------------------------------------

    def _adopt(self) -> None:
        """guard/_side.c, after a steady event from a read of one whole chunk: offer the
        stream to the relay thread (after a cool-down if it came back before)."""
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

    def broke(self, exc: Exception) -> None:
        """Taking the stream back from the thread failed: this request ends, as a read
        callback's error ends its connection."""
        self._fail(UpstreamError(f"the guard failed relaying it: {exc!r}"))
