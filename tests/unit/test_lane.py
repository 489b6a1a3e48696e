"""The steady relay's thread (guard/_lane.c) against socket pairs: what it serves, what it hands
back untouched, the rest of a write a full client did not take, and a descriptor the event loop
closes under it, which it never writes once that number belongs to another connection."""

from __future__ import annotations

import errno
import os
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from engine_watchdog.core.wire import GAP_BOUNDS

lane = pytest.importorskip("engine_watchdog.guard._lane")
KEY = b'"text":"'


def chunk(*events: bytes) -> bytes:
    body = b"".join(events)
    return b"%x\r\n%b\r\n" % (len(body), body)


def text(i: int) -> bytes:
    return b'data: {"choices":[{"index":0,"text":"t%d"}]}\n\n' % i


class Pair:
    """An engine connection and a client connection, each a socket pair: the lane's ends are
    ``engine`` and ``client``, the test's are ``engine_peer`` and ``client_peer``."""

    def __init__(self) -> None:
        self.engine, self.engine_peer = socket.socketpair()
        self.client, self.client_peer = socket.socketpair()
        for s in (self.engine_peer, self.client_peer):
            s.settimeout(5)

    def close(self) -> None:
        for s in (self.engine, self.engine_peer, self.client, self.client_peer):
            s.close()


@pytest.fixture
def pump() -> Iterator[Any]:
    p = lane.Pump(GAP_BOUNDS)
    yield p
    p.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def adopt(pump: Any, pair: Pair, framed: bool = True) -> Any:
    got = pump.adopt(object(), pair.engine.fileno(), pair.client.fileno(), KEY, framed, 1.0)
    assert got is not None
    return got


def returned(pump: Any) -> list[Any]:
    """The lanes handed back, waiting up to 5 s for the first."""
    ready, _, _ = select.select([pump.fileno()], [], [], 5)
    assert ready, "nothing came back in 5 s"
    return list(pump.returned())


def test_steady_chunks_are_served_as_one_and_counted(pump: Any, pair: Pair) -> None:
    stream = adopt(pump, pair)
    pair.engine_peer.sendall(chunk(text(1)))
    assert pair.client_peer.recv(4096) == chunk(text(1))
    pair.engine_peer.sendall(chunk(text(2)) + chunk(text(3), text(4)))  # one read, 3 events
    assert pair.client_peer.recv(4096) == chunk(text(2), text(3), text(4))
    events, last_t, gaps, total = stream.take()
    assert events == 4 and sum(gaps) == 2 and last_t > 1.0 and total > 0
    assert stream.take()[0] == 0  # taken: zeroed
    assert pump.counts()[:3] == (2, 0, 0)


@pytest.mark.parametrize(
    "read",
    [
        chunk(b": keepalive\n\n"),
        chunk(b'data: {"choices":[{"index":0,"text":""}]}\n\n'),
        chunk(b'event: x\ndata: {"text":"a"}\n\n'),
        chunk(text(1))[:-3],  # a chunk cut short
        chunk(text(1)) + b"0\r\n\r\n",  # the last chunk
        b"5;ext=1\r\nhello\r\n",
        b"0\r\n\r\n",
    ],
)
def test_any_other_read_comes_back_untouched(pump: Any, pair: Pair, read: bytes) -> None:
    stream = adopt(pump, pair)
    pair.engine_peer.sendall(read)
    assert returned(pump) == [stream]
    assert stream.reclaim() == (read, False, 0)
    assert stream.take()[0] == 0
    pair.client_peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        pair.client_peer.recv(1)  # nothing was written


def test_the_end_of_the_engine_connection_comes_back(pump: Any, pair: Pair) -> None:
    stream = adopt(pump, pair)
    pair.engine_peer.shutdown(socket.SHUT_WR)
    assert returned(pump) == [stream]
    assert stream.reclaim() == (b"", False, 0)


def test_a_reset_engine_connection_comes_back_with_its_errno(pump: Any, pair: Pair) -> None:
    """The thread's recv takes the error: the event loop then reads only the end, so the errno
    comes back with the stream, for the guard's log (ConnectionResetError, as on the loop)."""
    stream = adopt(pump, pair)
    pair.engine.send(b"POST / HTTP/1.1\r\n")  # unread by the engine when it goes: a reset
    pair.engine_peer.close()
    assert returned(pump) == [stream]
    assert stream.reclaim() == (b"", False, errno.ECONNRESET)


def test_a_full_client_gets_the_rest_of_the_write_back_in_order(pump: Any, pair: Pair) -> None:
    pair.client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = adopt(pump, pair)
    big = b'data: {"choices":[{"index":0,"text":"%b"}]}\n\n' % (b"y" * 60000)
    sent = b""
    for _ in range(20):  # until the client's buffers are full and the lane comes back
        pair.engine_peer.sendall(chunk(big))
        sent += chunk(big)
        ready, _, _ = select.select([pump.fileno()], [], [], 0.2)
        if ready:
            break
    assert returned(pump) == [stream]
    rest, unsent, _ = stream.reclaim()
    assert unsent and rest
    got = b""
    pair.client_peer.setblocking(False)
    while True:
        try:
            got += pair.client_peer.recv(1 << 20)
        except BlockingIOError:
            break
    assert got + rest == sent  # the rest, written first by Python, completes the stream


def test_a_descriptor_the_loop_closes_is_never_written_under_its_next_owner(
    pump: Any, pair: Pair
) -> None:
    """The lane writes to its own duplicate: the old connection still gets the event, the new
    connection that now has the old descriptor number gets nothing."""
    stream = adopt(pump, pair)
    number = pair.client.fileno()
    pair.client.close()  # as the event loop closes a transport, before the stream is taken back
    new, new_peer = socket.socketpair()
    try:
        if new.fileno() != number:  # the lowest free number: normally the one just freed
            moved = os.dup2(new.fileno(), number)
            new.detach()
            new = socket.socket(fileno=moved)
        pair.engine_peer.sendall(chunk(text(7)))
        assert pair.client_peer.recv(4096) == chunk(text(7))
        new_peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            new_peer.recv(1)
    finally:
        new.close()
        new_peer.close()
    assert stream.reclaim() == (b"", False, 0)


def test_a_stopped_pump_hands_every_stream_back(pair: Pair) -> None:
    p = lane.Pump(GAP_BOUNDS)
    stream = adopt(p, pair)
    p.close()
    assert p.returned() == [stream]
    assert p.counts()[3] is False
    assert p.adopt(object(), pair.engine.fileno(), pair.client.fileno(), KEY, True, 1.0) is None
    pair.engine_peer.sendall(chunk(text(1)))  # nothing reads it now: the loop's again
    assert stream.reclaim() == (b"", False, 0)
    assert pair.engine.recv(4096) == chunk(text(1))


MANY_BACK = """
import select, socket, sys
sys.path.insert(0, ".")
from tests.unit.test_lane import GAP_BOUNDS, Pair, adopt, lane, returned, _until_handed_back
pump = lane.Pump(GAP_BOUNDS)
pairs = [Pair() for _ in range(83)]
first = [adopt(pump, p) for p in pairs[:63]]
for p in pairs[:63]:
    p.engine_peer.shutdown(socket.SHUT_WR)
_until_handed_back(pump, 63)
later = [adopt(pump, p) for p in pairs[63:]]
for p in pairs[63:]:
    p.engine_peer.shutdown(socket.SHUT_WR)
_until_handed_back(pump, 83)
assert sorted(map(id, returned(pump))) == sorted(map(id, first + later))
del first, later
pump.close()
print("ok")
"""


def test_more_streams_back_at_once_than_its_table_has_slots() -> None:
    """Every stream of a full table comes back, and more are taken and come back, before Python
    takes any of them: each keeps its slot until taken, so the queue never outgrows the table.
    (In a process of its own: the overflow this once was corrupted the heap, found at exit.)"""
    ran = subprocess.run(
        [sys.executable, "-c", MANY_BACK], capture_output=True, text=True, timeout=60
    )
    assert (ran.returncode, ran.stdout.strip()) == (0, "ok"), ran.stderr[-2000:]


def _until_handed_back(pump: Any, n: int) -> None:
    for _ in range(500):
        if pump.counts()[1] >= n:
            return
        select.select([], [], [], 0.01)
    raise AssertionError(f"{pump.counts()[1]} of {n} handed back")


def test_a_pump_that_cannot_start_leaves_every_descriptor_alone() -> None:
    with pytest.raises(TypeError):
        lane.Pump((1.0, "x"))
    os.fstat(0)  # stdin still open (a failed start once closed descriptor 0 three times)
