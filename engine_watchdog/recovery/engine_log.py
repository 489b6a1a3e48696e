"""Supervise mode's copy of the engine's output: to the watchdog's stderr and to a log file.

Read in chunks, never by lines: asyncio's ``readline()`` fails on a line over its limit (64 KiB),
and engines print longer ones (tracebacks, config dumps holding the whole command line). The
copier never stops draining while the engine runs: output that cannot be written (a full disk,
a closed stderr) is dropped, said once, and never left in the pipe, where the engine would block
on its next write. The log file is bounded: past ``max_bytes`` it becomes ``<log>.1`` (replacing
the one before) and a new file begins, so a bundle's log tail holds the latest output and the
disk at most twice the bound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from engine_watchdog.host import logs
from engine_watchdog.host.tools import make_private_dirs

log = logging.getLogger(__name__)
CHUNK_BYTES = 64 << 10
LOG_MAX_BYTES = 64 << 20


class EngineLog:
    """The engine's log file: appended chunk by chunk, rotated at ``max_bytes``. Shared by the
    copiers of successive engines (the old one's last words and the new one's first)."""

    def __init__(self, path: Path, max_bytes: int = LOG_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd: int | None = None
        self._size = 0
        self._failing = False

    def write(self, data: bytes) -> None:
        """Append ``data``; on an error drop it (said once per outage), never raise."""
        try:
            if self._fd is None or self._size + len(data) > self.max_bytes:
                self._reopen(rotate=self._fd is not None)
            assert self._fd is not None
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                self._size += n
                view = view[n:]
        except OSError as exc:
            if not self._failing:
                log.error(
                    "cannot write the engine log %s (%s): its output is dropped until it can "
                    "be written again (the engine is not held up)",
                    self.path,
                    exc.strerror or exc,
                )
                self._failing = True
            return
        if self._failing:
            log.warning("the engine log %s is written again", self.path)
            self._failing = False

    def _reopen(self, rotate: bool) -> None:
        self.close()
        make_private_dirs(self.path.parent)  # mkdir -p would leave the parents 0755
        if rotate:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


MAX_CARRY_BYTES = 1 << 20
"""A line longer than this is masked in pieces (a secret cut across two is then missed)."""


async def copy_output(
    stream: asyncio.StreamReader,
    engine_log: EngineLog,
    echo: bool,
    mask: Callable[[bytes], bytes] = lambda data: data,
) -> None:
    """Copy ``stream`` until EOF (the engine and all that share its pipe are gone), each run of
    whole lines through ``mask`` first (the secrets of its command line and environment): a
    chunk may end inside a line, and so inside a secret, so the end of a line waits for the
    next chunk, up to MAX_CARRY_BYTES."""
    out: BinaryIO | None = getattr(sys.stderr, "buffer", None) if echo else None
    carry = b""
    while chunk := await stream.read(CHUNK_BYTES):
        data = carry + chunk
        cut = data.rfind(b"\n") + 1 or (len(data) if len(data) >= MAX_CARRY_BYTES else 0)
        carry = data[cut:]
        if cut:
            out = _emit(mask(data[:cut]), out, engine_log)
    if carry:
        _emit(mask(carry), out, engine_log)


def _emit(data: bytes, out: BinaryIO | None, engine_log: EngineLog) -> BinaryIO | None:
    """To stderr (None once it is closed or gone) and to the log file."""
    if out is not None:  # stderr: stdout carries the watchdog's own (JSON) lines
        try:
            out.write(logs.engine_lines(data))  # in JSON mode: a record a line
            out.flush()
        except (OSError, ValueError):  # closed or gone: the log file still gets it
            out = None
    engine_log.write(data)
    return out
