"""The relay thread (guard/_relay.c, guard/relay_thread.c) against socket pairs: what it serves
(whole chunks, framed by llhttp, any event-stream shape, counted by the stream's own Progress),
what it hands back untouched, the rest of a write a full client did not take, a descriptor the
event loop closes under it, which it never writes once that number belongs to another
connection, and a fork() while streams are on it."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from engine_watchdog.core.wire import GAP_BOUNDS

relay = pytest.importorskip("engine_watchdog.guard._relay")


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


class Relay:
    """A guard's compiled path: its gap histogram and its relay thread."""

    def __init__(self) -> None:
        self.hist = relay.Hist(GAP_BOUNDS)
        self.pump = relay.Pump(self.hist)

    def progress(self) -> Any:
        """A stream's Progress past its first token, as the event loop hands it over."""
        p = relay.Progress(self.hist)
        assert p.feed(text(0), 1.0) == 1
        return p

    def adopt(self, pair: Pair, framed: bool = True, progress: Any = None) -> Any:
        progress = self.progress() if progress is None else progress
        got = self.pump.adopt(
            object(), progress, pair.engine.fileno(), pair.client.fileno(), framed
        )
        assert got is not None
        return got

    def returned(self) -> list[Any]:
        """The lanes handed back, waiting up to 5 s for the first."""
        ready, _, _ = select.select([self.pump.fileno()], [], [], 5)
        assert ready, "nothing came back in 5 s"
        return list(self.pump.returned())


@pytest.fixture
def r() -> Iterator[Relay]:
    got = Relay()
    yield got
    got.pump.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def test_whole_chunks_are_served_as_one_write_and_counted(r: Relay, pair: Pair) -> None:
    stream = r.adopt(pair)
    pair.engine_peer.sendall(chunk(text(1)))
    assert pair.client_peer.recv(4096) == chunk(text(1))
    pair.engine_peer.sendall(chunk(text(2)) + chunk(text(3), text(4)))  # one read, 3 events
    assert pair.client_peer.recv(4096) == chunk(text(2), text(3), text(4))
    events, last_t, reads = stream.take()
    assert events == 4 and last_t is not None and last_t > 1.0 and reads == 2
    assert stream.take()[0] == 0  # taken: zeroed
    counts, total = r.hist.snapshot()
    assert sum(counts) == 2 and total > 0  # one gap per read, into the guard's histogram
    assert r.pump.counts()[:3] == (2, 0, 0)


@pytest.mark.parametrize(
    ("read", "body", "tokens"),
    [
        (chunk(b": keepalive\n\n"), b": keepalive\n\n", 0),
        (chunk(b'data: {"text":""}\n\n'), b'data: {"text":""}\n\n', 0),
        (chunk(b'event: x\ndata: {"text":"a"}\n\n'), b'event: x\ndata: {"text":"a"}\n\n', 1),
        (chunk(b'data: {"text":"a"}\r\n\r\n'), b'data: {"text":"a"}\r\n\r\n', 1),
        (chunk(b'data:{"text":"a"}\r\r'), b'data:{"text":"a"}\r\r', 1),
        (chunk(b'data: {"text":"a"}\r'), b'data: {"text":"a"}\r', 0),  # it ends in a later read
        (b"5;ext=1\r\nhello\r\n", b"hello", 0),  # a chunk extension: llhttp frames it
        (chunk(b"data: {") + chunk(b'"delta":"x"}\n\n'), b'data: {"delta":"x"}\n\n', 1),
    ],
)
def test_any_shape_of_whole_chunks_is_served_and_counted(
    r: Relay, pair: Pair, read: bytes, body: bytes, tokens: int
) -> None:
    stream = r.adopt(pair)
    pair.engine_peer.sendall(read)
    assert pair.client_peer.recv(4096) == chunk(body)  # one chunk: what the loop writes of a read
    assert stream.take()[0] == tokens
    assert r.pump.counts()[:2] == (1, 0)


@pytest.mark.parametrize(
    "read",
    [
        chunk(text(1))[:-3],  # a chunk cut short
        chunk(text(1)) + b"1",  # the next chunk's size begun
        chunk(text(1)) + b"0\r\n\r\n",  # the last chunk
        b"0\r\n\r\n",
        b"zz\r\n",  # not a chunk at all
    ],
)
def test_any_other_read_comes_back_untouched(r: Relay, pair: Pair, read: bytes) -> None:
    stream = r.adopt(pair)
    pair.engine_peer.sendall(read)
    assert r.returned() == [stream]
    assert stream.reclaim() == (read, False, 0)
    assert stream.take()[0] == 0
    pair.client_peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        pair.client_peer.recv(1)  # nothing was written


def test_a_read_handed_back_left_the_streams_reader_where_it_was(r: Relay, pair: Pair) -> None:
    """The Progress is fed only what the thread wrote: the read it hands back is the event
    loop's to feed, once."""
    progress = r.progress()
    stream = r.adopt(pair, progress=progress)
    pair.engine_peer.sendall(chunk(b'data: {"text":"a"}\n'))  # an event under way
    pair.client_peer.recv(4096)
    cut = chunk(b"\n") + b"1"
    pair.engine_peer.sendall(cut)
    assert r.returned() == [stream]
    assert stream.reclaim() == (cut, False, 0)
    assert not progress.boundary
    assert progress.feed(b"\n", 2.0) == 1  # the loop's parser gives it the event's end


def test_the_end_of_the_engine_connection_comes_back(r: Relay, pair: Pair) -> None:
    stream = r.adopt(pair)
    pair.engine_peer.shutdown(socket.SHUT_WR)
    assert r.returned() == [stream]
    assert stream.reclaim() == (b"", False, 0)


def test_a_reset_engine_connection_comes_back_with_its_errno(r: Relay, pair: Pair) -> None:
    """The thread's recv takes the error: the event loop then reads only the end, so the errno
    comes back with the stream, for the guard's log (ConnectionResetError, as on the loop)."""
    stream = r.adopt(pair)
    pair.engine.send(b"POST / HTTP/1.1\r\n")  # unread by the engine when it goes: a reset
    pair.engine_peer.close()
    assert r.returned() == [stream]
    assert stream.reclaim() == (b"", False, errno.ECONNRESET)


def test_a_full_client_gets_the_rest_of_the_write_back_in_order(r: Relay, pair: Pair) -> None:
    pair.client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = r.adopt(pair)
    big = b'data: {"choices":[{"index":0,"text":"%b"}]}\n\n' % (b"y" * 60000)
    sent = b""
    for _ in range(20):  # until the client's buffers are full and the lane comes back
        pair.engine_peer.sendall(chunk(big))
        sent += chunk(big)
        ready, _, _ = select.select([r.pump.fileno()], [], [], 0.2)
        if ready:
            break
    assert r.returned() == [stream]
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
    r: Relay, pair: Pair
) -> None:
    """The lane writes to its own duplicate: the old connection still gets the event, the new
    connection that now has the old descriptor number gets nothing."""
    stream = r.adopt(pair)
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
    r = Relay()
    stream = r.adopt(pair)
    r.pump.close()
    assert r.pump.returned() == [stream]
    assert r.pump.counts()[3] is False
    progress = r.progress()
    assert (
        r.pump.adopt(object(), progress, pair.engine.fileno(), pair.client.fileno(), True) is None
    )
    pair.engine_peer.sendall(chunk(text(1)))  # nothing reads it now: the loop's again
    assert stream.reclaim() == (b"", False, 0)
    assert pair.engine.recv(4096) == chunk(text(1))


def test_a_progress_the_thread_holds_is_not_fed_by_the_loop(r: Relay, pair: Pair) -> None:
    progress = r.progress()
    stream = r.adopt(pair, progress=progress)
    with pytest.raises(RuntimeError):
        progress.feed(text(1), 2.0)
    with pytest.raises(ValueError):  # nor adopted twice
        r.pump.adopt(object(), progress, pair.engine.fileno(), pair.client.fileno(), True)
    stream.reclaim()
    assert progress.feed(text(1), 2.0) == 1
    again = r.adopt(pair, progress=progress)
    del stream  # an old lane freed after a new one holds the Progress: it stays the new one's
    with pytest.raises(RuntimeError):
        progress.feed(text(1), 2.0)
    again.reclaim()


MANY_BACK = """
import select, socket, sys
sys.path.insert(0, ".")
from tests.unit.test_relay import Pair, Relay, _until_handed_back
r = Relay()
pairs = [Pair() for _ in range(83)]
first = [r.adopt(p) for p in pairs[:63]]
for p in pairs[:63]:
    p.engine_peer.shutdown(socket.SHUT_WR)
_until_handed_back(r.pump, 63)
later = [r.adopt(p) for p in pairs[63:]]
for p in pairs[63:]:
    p.engine_peer.shutdown(socket.SHUT_WR)
_until_handed_back(r.pump, 83)
assert sorted(map(id, r.returned())) == sorted(map(id, first + later))
del first, later
r.pump.close()
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
    _until_counted(pump, 1, n, "handed back")


def _until_counted(pump: Any, index: int, n: int, what: str) -> None:
    """Until the pump's count ``index`` (0: relayed, 1: handed back) reaches ``n``; 5 s."""
    for _ in range(500):
        if pump.counts()[index] >= n:
            return
        select.select([], [], [], 0.01)
    raise AssertionError(f"{pump.counts()[index]} of {n} {what}")


def test_a_pump_that_cannot_start_leaves_every_descriptor_alone() -> None:
    with pytest.raises(TypeError):
        relay.Pump((1.0, 2.0))  # not a Hist
    with pytest.raises(TypeError):
        relay.Hist((1.0, "x"))
    os.fstat(0)  # stdin still open (a failed start once closed descriptor 0 three times)


def in_child(work: Any) -> int:
    """``work()`` in a forked child, which then exits without Python's own exit (as a pre-fork
    server's worker may); its exit status (0: ``work`` returned; 70: it raised)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 0
        try:
            work()
        except BaseException:
            code = 70
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_a_forked_child_that_frees_the_relay_leaves_the_parents_streams_moving() -> None:
    """After fork() the child holds copies of the thread's table, epoll and eventfds, but not
    the thread. A child that frees every Lane and the Pump (a GC pass, a close) must not unhook
    the parent's streams nor stop the parent's thread: the parent's streams keep moving, and
    its relay takes new ones."""
    r, pairs = Relay(), [Pair() for _ in range(4)]
    try:
        lanes = [r.adopt(p) for p in pairs]
        for i, p in enumerate(pairs):
            p.engine_peer.sendall(chunk(text(i)))
            assert p.client_peer.recv(4096) == chunk(text(i))

        def free_everything() -> None:
            nonlocal lanes
            for lane in lanes:
                lane.reclaim()  # as Python takes a stream back: no epoll change in the child
            r.pump.returned()  # (the parent's wake-up is not the child's to clear)
            lanes = []
            r.pump.close()  # the parent's thread must not be told to stop
            r.pump = None
            gc.collect()

        assert in_child(free_everything) == 0
        for round_ in range(3):
            for i, p in enumerate(pairs):
                p.engine_peer.sendall(chunk(text(10 * round_ + i)))
                assert p.client_peer.recv(4096) == chunk(text(10 * round_ + i))
        assert r.pump.counts()[3] is True  # still running
        extra = Pair()
        pairs.append(extra)
        lanes.append(r.adopt(extra))
        extra.engine_peer.sendall(chunk(text(99)))
        assert extra.client_peer.recv(4096) == chunk(text(99))
        assert [lane.take()[0] for lane in lanes] == [4, 4, 4, 4, 1]
    finally:
        r.pump.close()
        for p in pairs:
            p.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_a_fork_while_the_thread_relays_never_leaves_the_child_a_locked_mutex() -> None:
    """fork() while the thread is busy serving: the child's copy of the mutex must be free (the
    module's fork handlers take it before the fork), so the child's calls that lock it return."""
    r, pairs = Relay(), [Pair() for _ in range(8)]
    stop = threading.Event()

    def flood(p: Pair) -> None:
        p.client_peer.setblocking(False)
        while not stop.is_set():
            try:
                p.engine_peer.sendall(chunk(text(1)))
                with contextlib.suppress(BlockingIOError):
                    while p.client_peer.recv(1 << 16):
                        pass
            except OSError:
                return

    floods = [threading.Thread(target=flood, args=(p,), daemon=True) for p in pairs]
    try:
        lanes = [r.adopt(p) for p in pairs]
        for t in floods:
            t.start()
        # The forks below must meet the thread serving: on a loaded machine the floods can
        # still be starting when 30 forks are done.
        _until_counted(r.pump, 0, 1, "relayed")

        def touch() -> None:
            signal.alarm(5)  # a locked mutex would hang here: the alarm ends the child
            r.pump.counts()
            for lane in lanes:
                lane.take()
            lanes[0].reclaim()

        codes = [in_child(touch) for _ in range(30)]
        assert codes == [0] * 30
        assert r.pump.counts()[0] > 0  # (the thread was serving meanwhile)
    finally:
        stop.set()
        for t in floods:  # (before the sockets close under them)
            if t.is_alive():
                t.join(10)
        r.pump.close()
        for p in pairs:
            p.close()
