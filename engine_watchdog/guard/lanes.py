"""The relay thread: a stream is handed to a thread of its own (guard/_relay.c), which carries
its reads from the engine's socket to the client's without the interpreter or the event loop,
and hands the stream back at the first read it does not serve.

With the per-event rules compiled (guard/scan.py), what is left of the guard's CPU per event
above a byte relay's is the event loop's own cost per read; a relay in C pays none of it
(docs/performance.md).

When a stream is handed over (:meth:`Lanes.adopt`): after a read the event loop relayed that
left its response parser between two chunks (guard/fast.py: llhttp said so), past the stream's
first token, with nothing waiting in the client's buffer, on plain TCP at both ends, with the
guard on ``time.time`` (the thread's clock). The event loop stops reading the engine's socket
while the thread reads it. The thread frames each read with llhttp and feeds the stream's own
Progress with it (guard/sse.c): every event-stream shape is served, and counted as the loop
counts it.

What comes back (:meth:`Lanes.on_returned`, woken by the thread through an eventfd): the
stream, its counts, and either the read the thread did not serve (not whole chunks, the
response's end: Python feeds it to the stream's parser, as if it had just come) or the part of
a write the client did not take (Python writes it first). A stream that comes back waits twice
as many reads before it goes again (at most ``fast.COOL_MAX``), so one that keeps
coming back costs little.

Counts wait in the thread until Python takes them: at every probe round and scrape
(:meth:`Lanes.sync`), and when a stream comes back. A stream is always taken back
(``fast.EngineSide.close``) before its client is written to or its engine connection
is closed.

Across ``fork()``: the child gets copies of the thread's table, epoll and eventfds, but not the
thread. Handlers the module registers (``pthread_atfork``) take every relay's mutex before the
fork, so the child's copies are never locked, and mark them a child's: there a Lane or a Pump
freed, closed or reclaimed touches nothing the parent's thread uses (no epoll change, no
wake-up read, no stop sent), and nothing is adopted.
``ENGINE_WATCHDOG_PURE_PYTHON=1`` turns this off with the compiled rules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from engine_watchdog.guard import scan
from engine_watchdog.guard.exchange import Exchange
from engine_watchdog.guard.stats import GuardStats

if TYPE_CHECKING:
    from engine_watchdog.guard._relay import Lane

log = logging.getLogger(__name__)


class Stream(Protocol):
    """A request's engine connection, as the relay sees it (``fast.EngineSide``)."""

    transport: asyncio.Transport | None
    lane: Lane | None

    def never_adopt(self) -> None: ...

    def taken_back(self) -> None: ...

    def broke(self, exc: Exception) -> None: ...


class Client(Protocol):
    """Where a stream goes (``fast.Client``)."""

    ex: Exchange
    transport: asyncio.Transport
    framed: bool
    clock: Callable[[], float]


class Lanes:
    """One guard's relay thread, and the streams on it."""

    def __init__(self, pump: Any, stats: GuardStats) -> None:
        self.pump = pump
        self.stats = stats
        self.adopted: dict[Stream, Client] = {}
        """The streams on the thread, and where each goes."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(pump.fileno(), self.on_returned)

    @classmethod
    def start(cls, stats: GuardStats) -> Lanes | None:
        """The relay's thread, started; None where it is not built (or the Python path is
        asked for)."""
        if scan.relay is None:
            return None
        try:
            pump = scan.relay.Pump(stats.gaps)
        except OSError as exc:  # no thread, epoll or eventfd to be had: the event loop's path
            log.warning("guard: the relay thread did not start (%s): streams stay on the loop", exc)
            return None
        return cls(pump, stats)

    def close(self) -> None:
        """Stop the thread; every stream still on it comes back to the event loop."""
        self._loop.remove_reader(self.pump.fileno())
        self.pump.close()
        self.on_returned()

    def adopt(self, up: Stream, client: Client) -> None:
        """Hand ``up``'s stream to the thread, if it can go now (module docstring)."""
        ex, engine, out = client.ex, up.transport, client.transport
        if engine is None or out.is_closing() or out.get_write_buffer_size():
            return
        if ex.last_event_t is None or ex.waiting_since is None:
            return
        efd, cfd = _plain_fd(engine), _plain_fd(out)
        if efd < 0 or cfd < 0 or client.clock is not time.time:
            up.never_adopt()  # TLS, or a clock of its own: never on this stream
            return
        engine.pause_reading()  # the thread's alone from now on
        try:
            lane = self.pump.adopt(up, ex.progress, efd, cfd, client.framed)
        except OSError:  # no descriptor for its duplicates (EMFILE): the loop keeps it
            lane = None
        if lane is None:  # the thread has stopped, or could not take it
            engine.resume_reading()
            up.never_adopt()
            return
        up.lane = lane
        self.adopted[up] = client

    def sync(self) -> None:
        """Every stream's counts from the thread into the guard's (before they are read)."""
        now = time.time()  # (the thread's clock: adoption asks for it)
        for up, client in self.adopted.items():
            if up.lane is not None and self.stats.credit(client.ex, up.lane.take()):
                client.ex.moved_t = now

    def on_returned(self) -> None:
        """The streams the thread handed back: each to its own side."""
        for lane in self.pump.returned():
            up = lane.owner
            if up.lane is not lane:
                continue  # taken back already (Stream.close)
            try:
                up.taken_back()
            except Exception as exc:  # one stream's failure: its own end, never the others'
                up.broke(exc)

    def release(self, up: Stream) -> tuple[bytes, bool, int]:
        """Take ``up``'s stream back now, with its counts; what came back with it, and the
        errno of the engine read that failed (0: none)."""
        lane, up.lane = up.lane, None
        client = self.adopted.pop(up)
        assert lane is not None
        try:
            return lane.reclaim()  # (first: the thread counts nothing after it)
        finally:
            self.stats.credit(client.ex, lane.take())


def _plain_fd(transport: asyncio.BaseTransport) -> int:
    """The socket's descriptor where the transport is plain TCP; -1 otherwise (TLS)."""
    if transport.get_extra_info("sslcontext") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    return -1 if sock is None else int(sock.fileno())
