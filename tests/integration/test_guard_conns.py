"""Slowloris, through the console script: idle connections past
--guard-max-idle-connections and heads not whole within --guard-head-timeout are closed, and
counted in engine_watchdog_guard_connections_closed_total{reason}."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from engine_watchdog.sim.launcher import SimProcess
from tests.tools.guard import watched
from tests.tools.watch import metric
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(120)
CLOSED = "engine_watchdog_guard_connections_closed_total"


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024, socket.MSG_DONTWAIT) is not None and True
    except BlockingIOError:
        return False
    except OSError:
        return True


async def test_idle_connections_are_capped_and_slow_heads_time_out() -> None:
    async with (
        SimProcess("--served-model-name", "m") as sim,
        watched(sim, "--guard-head-timeout", "2", "--guard-max-idle-connections", "3") as g,
    ):
        host, port = g.guard_url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(5)]
        try:
            await eventually(lambda: sum(map(closed, idle)) >= 2, 10, what="2 past the cap")
            dripped = socket.create_connection((host, int(port)))
            idle.append(dripped)
            started = time.monotonic()
            dripped.sendall(b"GET /v1/models HTTP/1.1\r\n")
            while not closed(dripped) and time.monotonic() - started < 10:
                dripped.sendall(b"X")  # a byte at a time, never the blank line
                await asyncio.sleep(0.5)
            assert closed(dripped) and time.monotonic() - started < 5
            text = await g.metrics()
            assert (metric(text, CLOSED, reason="idle-cap") or 0) >= 2, text
            assert (metric(text, CLOSED, reason="head-timeout") or 0) >= 1, text
        finally:
            for sock in idle:
                sock.close()
