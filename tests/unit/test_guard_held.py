"""The guard's self-check (guard/held.py) reads sockets that may close under it: it must never
raise into the probe round that runs it."""

from __future__ import annotations

import errno
import logging
import socket

import pytest

from engine_watchdog.guard.held import pending
from engine_watchdog.runtime.watch.notices import Notices


def test_pending_bytes_of_a_closed_or_missing_socket_are_unknown_not_an_error() -> None:
    """Was: ValueError from fcntl.ioctl(-1, ...) (a transport closed under the check: its
    socket's fileno() is -1), raised out of Guard.snapshot, the probe round's call."""
    a, b = socket.socketpair()
    b.sendall(b"12345")
    assert pending(a.fileno()) == 5
    a.close()
    b.close()
    assert pending(a.fileno()) == -1  # (fileno() is -1 once closed)
    assert pending(-1) == -1


def test_a_probe_out_of_descriptors_is_one_line_naming_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Was: a probe's EMFILE logged as a bug, with its traceback (a guard at its open files
    limit: tests/integration/test_guard_stress.py)."""
    notices = Notices("http://127.0.0.1:1")
    caplog.set_level(logging.ERROR)
    for _ in range(3):
        assert notices.failed(OSError(errno.EMFILE, "Too many open files"))
    (record,) = caplog.records
    assert record.exc_info is None and "ulimit -n" in record.getMessage()
