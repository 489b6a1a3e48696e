"""The process probe's socket scan is kept while the engine's listener lives
(probes/engine_procs.py): a busy guard's timed rediscoveries do not read every socket on the
host again, and a listener that is gone is looked for at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping

import pytest

from engine_watchdog.probes.engine_procs import KeptListeners
from engine_watchdog.probes.proctable import RawProc

PORT = 8000


class CountingTable:
    """The host's listeners as plain data, and how often they were scanned."""

    def __init__(self, holders: frozenset[int]) -> None:
        self.holders = holders
        self.scans = 0

    def processes(self) -> Mapping[int, RawProc]:
        return {}

    def listeners(self, host: str | None = None) -> Mapping[int, frozenset[int]] | None:
        self.scans += 1
        return {PORT: self.holders, 22: frozenset({1})}


@pytest.fixture
def listener() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_the_scan_is_kept_while_the_listener_lives(listener: subprocess.Popen[bytes]) -> None:
    table = CountingTable(frozenset({listener.pid}))
    kept = KeptListeners(table, PORT)
    first = kept.listeners("127.0.0.1")
    assert [kept.listeners("127.0.0.1") for _ in range(3)] == [first] * 3
    assert table.scans == 1
    kept.listeners("10.0.0.1")  # another address asked: a scan of its own
    assert table.scans == 2
    kept.forget()
    kept.listeners("10.0.0.1")
    assert table.scans == 3


def test_a_gone_listener_is_looked_for_at_once(listener: subprocess.Popen[bytes]) -> None:
    table = CountingTable(frozenset({listener.pid}))
    kept = KeptListeners(table, PORT)
    kept.listeners()
    listener.kill()
    listener.wait(timeout=10)
    kept.listeners()
    assert table.scans == 2


def test_without_a_listener_on_the_port_every_discovery_scans() -> None:
    table = CountingTable(frozenset())  # not up yet, or its owner cannot be seen
    kept = KeptListeners(table, PORT)
    for _ in range(3):
        kept.listeners()
    assert table.scans == 3
