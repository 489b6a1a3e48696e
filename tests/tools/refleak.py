"""Reference leaks of the guard's C, on a debug interpreter (Debian's python3.11-dbg): every
entry point of guard/_relay.c used over and over (a Hist, a Progress fed events of every shape
and a wrong type, a Pump adopting, serving, handing back and refusing streams, Lanes taken,
reclaimed and freed), and the interpreter's total reference count and allocated blocks read
after each round. A round of the same socket work without the module is the baseline: any
growth beyond it is a leak. ``make sanitize`` runs it where the debug interpreter is
(deploy/ensure-tools.sh installs it):

    python3.11d tests/tools/refleak.py BUILD_DIR     # BUILD_DIR holds _relay.cpython-311d-*.so
"""

from __future__ import annotations

import contextlib
import gc
import select
import socket
import sys
from collections.abc import Callable

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
EVENT = b'data: {"choices":[{"index":0,"text":"t"}]}\n\n'
SHAPES = EVENT * 3 + b': k\r\n\r\ndata: {"delta":"x"}\r\r'


def chunk(body: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(body), body)


Work = Callable[[socket.socket, socket.socket, socket.socket, socket.socket], None]


def streams(work: Work) -> None:
    """``work(engine, engine_peer, client, client_peer)`` over ten socket pairs' pairs."""
    for _ in range(10):
        e, ep = socket.socketpair()
        c, cp = socket.socketpair()
        try:
            work(e, ep, c, cp)
        finally:
            for s in (e, ep, c, cp):
                s.close()


def baseline() -> None:
    def work(e: socket.socket, ep: socket.socket, c: socket.socket, cp: socket.socket) -> None:
        ep.sendall(chunk(EVENT))
        e.recv(4096)
        ep.sendall(b"0\r\n\r\n")
        select.select([e.fileno()], [], [], 5)

    streams(work)


def with_module(relay: object) -> None:
    h = relay.Hist(BOUNDS)  # type: ignore[attr-defined]
    p = relay.Progress(h)  # type: ignore[attr-defined]
    for i in range(50):
        p.feed(SHAPES, 1.0 + i)
    h.snapshot()
    _ = h.bounds, p.boundary
    with contextlib.suppress(TypeError):
        p.feed("not bytes", 1.0)
    pump = relay.Pump(h)  # type: ignore[attr-defined]

    def work(e: socket.socket, ep: socket.socket, c: socket.socket, cp: socket.socket) -> None:
        lane = pump.adopt(object(), p, e.fileno(), c.fileno(), True)
        with contextlib.suppress(ValueError):  # adopted already
            pump.adopt(object(), p, e.fileno(), c.fileno(), True)
        ep.sendall(chunk(EVENT))
        cp.recv(4096)  # served
        lane.take()
        _ = lane.owner
        ep.sendall(b"0\r\n\r\n")  # the last chunk: handed back
        select.select([pump.fileno()], [], [], 5)
        pump.returned()
        lane.reclaim()
        pump.counts()

    streams(work)
    pump.close()


def growth(round_: Callable[[], None]) -> tuple[float, float]:
    """References and blocks gained per round, after warm-up rounds."""
    for _ in range(3):
        round_()
    gc.collect()
    total: Callable[[], int] = sys.gettotalrefcount
    refs, blocks = total(), sys.getallocatedblocks()
    for _ in range(20):
        round_()
    gc.collect()
    return (total() - refs) / 20, (sys.getallocatedblocks() - blocks) / 20


def main() -> None:
    if not hasattr(sys, "gettotalrefcount"):
        sys.exit("refleak: run it with a debug interpreter (python3.11d)")
    sys.path.insert(0, sys.argv[1])
    import _relay  # type: ignore[import-not-found]

    base = growth(baseline)
    module = growth(lambda: with_module(_relay))
    refs, blocks = module[0] - base[0], module[1] - base[1]
    print(f"refleak: per round, references {refs:+.2f}, blocks {blocks:+.2f} "
          f"(beyond the baseline's {base[0]:+.2f}, {base[1]:+.2f})")  # fmt: skip
    sys.exit(0 if refs < 0.5 and blocks < 0.5 else 1)


if __name__ == "__main__":
    main()
