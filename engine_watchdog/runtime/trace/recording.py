"""Writing a trace (``watch --record``, ``record -o``): the format is in format.py beside it;
and the round's records on their way to it and to the incident timeline.

The file is private (0600, like everything the watchdog writes: traces hold the engine's
process titles and errors). A title's absolute paths are written without their directories
(``<dir>/python -m vllm... --model <dir>/Llama-3.1-8B``): a trace travels (a bug report, the
test corpus), its replay reads each process's role and state and never a path, and a checkout's
or a home's directories name a machine and its user. The incident bundles, which stay on the
machine, keep the whole command lines.

A trace that cannot be opened is bad input (exit 73, one line); one that cannot be written
later (a full disk) stops the recording, said once, and the watching goes on: a watchdog must
not stop watching for the sake of its own trace.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from engine_watchdog.core.settings import CannotWriteError

log = logging.getLogger(__name__)
_DIRECTORIES = re.compile(r"""(?<![^\s=:,'"(])/(?:[^\s/=:,'"()]+/)+""")
"""An absolute path's directories: after a start, a space, ``=``, ``:`` (``--model=/m``,
``PATH=/a:/b``), a comma, a quote or a parenthesis, never inside a URL (``http://h/v1``)."""
DIRECTORIES = "<dir>/"


def portable_title(title: str) -> str:
    """``/srv/venv/bin/python -m x --model /d/m`` -> ``<dir>/python -m x --model <dir>/m``."""
    return _DIRECTORIES.sub(DIRECTORIES, title)


def portable(rec: dict[str, Any]) -> dict[str, Any]:
    """The record as a trace keeps it: a ``procs`` record's titles portable, the rest as is."""
    if rec.get("kind") != "procs" or not isinstance(rec.get("procs"), list):
        return rec
    procs = [
        {**p, "title": portable_title(p["title"])} if isinstance(p.get("title"), str) else p
        for p in rec["procs"]
    ]
    return {**rec, "procs": procs}


class TraceWriter:
    """Appends records to a trace file; one line per record, flushed so a crash loses nothing."""

    def __init__(self, path: Path, option: str = "--record") -> None:
        self.path = path
        self.error: OSError | None = None
        """Why the recording stopped (None while it goes on)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise CannotWriteError(
                f"{option} {path}: cannot write it ({exc.strerror}): give a file in a "
                "folder that exists and that this user may write"
            ) from None
        self._file = os.fdopen(fd, "a", encoding="utf-8")

    def write(self, rec: dict[str, Any]) -> None:
        if self.error is not None:
            return
        try:
            self._file.write(json.dumps(portable(rec), separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError as exc:
            self.error = exc
            log.error(
                "trace %s: recording stopped (%s): free space there, or record elsewhere; "
                "watching goes on",
                self.path,
                exc.strerror,
            )

    def close(self) -> None:
        with contextlib.suppress(OSError):  # what a full disk kept in the buffer is lost
            self._file.close()


TIMELINE_SECONDS = 600.0
"""How much recorded history an incident bundle gets."""


class RoundRecords:
    """A probe round's records, held until the round ends (probes finish in any order), then
    published in time order into the timeline (for bundles) and to the trace writers: a trace
    must replay in the order the detector judged it."""

    def __init__(self, listeners: Iterable[Callable[[dict[str, Any]], None]] = ()) -> None:
        """``listeners``: the trace writers, each told every record."""
        self.timeline: deque[dict[str, Any]] = deque()
        self.listeners: list[Callable[[dict[str, Any]], None]] = list(listeners)
        self._round: list[dict[str, Any]] = []

    def hold(self, rec: dict[str, Any]) -> None:
        self._round.append(rec)

    def publish(self) -> None:
        for rec in sorted(self._round, key=lambda r: float(r["t"])):
            self.timeline.append(rec)
            for listener in self.listeners:
                listener(rec)
        self._round.clear()
        while self.timeline and self.timeline[-1]["t"] - self.timeline[0]["t"] > TIMELINE_SECONDS:
            self.timeline.popleft()
