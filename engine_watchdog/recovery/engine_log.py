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
from pathlib import Path
from typing import BinaryIO

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
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if rotate:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def copy_output(stream: asyncio.StreamReader, engine_log: EngineLog, echo: bool) -> None:
    """Copy ``stream`` until EOF (the engine and all that share its pipe are gone)."""
    out: BinaryIO | None = getattr(sys.stderr, "buffer", None) if echo else None
    while chunk := await stream.read(CHUNK_BYTES):
        if out is not None:  # stderr: stdout carries the watchdog's own (JSON) lines
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):  # closed or gone: the log file still gets it
                out = None
        engine_log.write(chunk)
