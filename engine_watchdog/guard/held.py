"""The guard checks itself: every request it holds moves, or is ended, within the per-request
threshold plus one probe round (docs/guard.md, "The guard checks itself").

Each probe round (:meth:`Guard.snapshot`) looks at the requests that have not moved (no read of
theirs relayed, by the event loop or the relay thread, no client drain) for longer than that:

- **ordered ended and still held**: the request judge named it stuck, or the engine stalled,
  and its end did not take;
- **bytes wait for it and the guard does not read them**: the engine's socket holds bytes for
  it while its client has nothing queued. Neither the engine (it sent) nor the client (it takes
  what is written) holds it: the guard does.

A silence with nothing waiting is the engine's, which the detector and the request judge decide
on; a client that does not read holds its own stream back (back-pressure). Each violation is
logged once per request, with its state (on the relay thread or not, its engine socket read or
paused, the bytes waiting, the client's queue, where its pump task waits), and counted
(``engine_watchdog_guard_self_check_violations_total``). The stream is then taken back from the
thread and its engine socket read again: a lost wake-up costs one round, not the request.
"""

from __future__ import annotations

import array
import fcntl
import logging
import termios
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine_watchdog.guard.exchange import Exchange

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Held:
    """A request's path as the self-check sees it (guard/fast.py ``EngineSide.held``)."""

    on_thread: bool
    reading: bool
    """The event loop reads its engine socket (or the thread does)."""
    waiting: int
    """Bytes in its engine socket's receive queue, not yet read by the guard (-1: unknown)."""
    queued: int
    """Bytes written to its client and not yet taken (the client transport's buffer)."""


@runtime_checkable
class Path(Protocol):
    """A request's engine connection (guard/fast.py ``EngineSide``)."""

    def held(self) -> Held: ...

    def unstick(self) -> None: ...


def pending(sock_fd: int) -> int:
    """Bytes in a socket's receive queue (FIONREAD), or -1 (unknown, or the socket closed)."""
    if sock_fd < 0:
        return -1
    out = array.array("i", [0])
    try:
        fcntl.ioctl(sock_fd, termios.FIONREAD, out, True)
    except (OSError, ValueError):
        return -1
    return out[0]


def violation(ex: Exchange, now: float, limit_s: float) -> str | None:
    """Why ``ex`` breaks the guard's promise, or None."""
    idle = now - max(ex.moved_t, ex.ended_t or ex.moved_t)
    if idle <= limit_s:
        return None
    if ex.ending is not None:
        return f"ended {idle:.0f} s ago ({ex.ending.value}) and still held"
    up = ex.upstream
    held = up.held() if isinstance(up, Path) else None
    if held is None or held.waiting <= 0 or held.queued:
        return None
    return f"{held.waiting} bytes wait at the engine for {idle:.0f} s, its client queue empty"


def describe(ex: Exchange, now: float) -> str:
    up = ex.upstream
    held = up.held() if isinstance(up, Path) else None
    where = "no engine connection"
    if held is not None:
        path = "relay thread" if held.on_thread else "event loop"
        reading = "reading" if held.reading else "paused"
        where = f"{path}, engine socket {reading}, {held.waiting} bytes waiting there, "
        where += f"{held.queued} bytes queued for the client"
    frame = "none"
    if ex.pump is not None and not ex.pump.done():
        stack = ex.pump.get_stack(limit=1)
        if stack:
            code = stack[-1].f_code
            frame = f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{stack[-1].f_lineno})"
    last = f"{now - ex.last_event_t:.1f} s ago" if ex.last_event_t is not None else "none yet"
    return (
        f"request {ex.key} held {now - ex.started_t:.0f} s, {ex.events} token events (last "
        f"{last}), waiting on the engine since {ex.waiting_since}; {where}; its task waits in "
        f"{frame}"
    )


class Counts(Protocol):
    violations: int


class SelfCheck:
    """The guard's check of itself, once per probe round."""

    def __init__(self, limit_s: float, counts: Counts) -> None:
        self.limit_s = limit_s
        self.counts = counts
        """Where each violation is counted (GuardStats.violations: the metric)."""

    def check(self, held: list[Exchange], now: float) -> None:
        for ex in held:
            if ex.self_checked:
                continue
            try:
                why = violation(ex, now, self.limit_s)
            except Exception:  # the check must never take the probe round down with it
                log.exception("guard self-check: reading request %s failed", ex.key)
                ex.self_checked = True
                continue
            if why is None:
                continue
            ex.self_checked = True
            self.counts.violations += 1
            log.error("guard self-check: %s: %s", why, describe(ex, now))
            if isinstance(ex.upstream, Path):
                ex.upstream.unstick()
