"""The action history on disk, and the restart rate limit it enforces.

Kept on disk (JSON Lines, one action per line) so that a restarted watchdog keeps counting: a
crash-looping watchdog must not restart-loop the engine.

The file outlives crashes, full disks and hand edits, so it is read defensively: a record that
is not one (bad bytes, bad JSON, a ``t`` that is not a finite number) is skipped, all of them in
one warning, and a time in the future counts as now (a clock that was wrong once must not block
restarts until that day). Each record is written as one whole line in one ``write`` on an
``O_APPEND`` descriptor; a line left torn (a kill mid-write, a short write on a full disk) is
ended before the next record, so it never swallows that record. A record that cannot be written
is still counted in memory: recovery goes on without its file (said once in the log, and in
``engine_watchdog_history_write_errors_total``).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from engine_watchdog.core.model import Action, Result
from engine_watchdog.core.settings import RateLimit, SettingsError
from engine_watchdog.host.logs import context
from engine_watchdog.host.tools import make_private_dirs

log = logging.getLogger(__name__)
KEEP_LINES = 1000
READ_TAIL_BYTES = 1 << 20
"""Only the file's last MiB is read at start: far more than KEEP_LINES records (~150 B each)."""
_FIELDS = ("target", "action", "result")
_OPTIONAL = ("engine", "incident")
"""Written only when set (an action outside an incident has neither)."""


@dataclass(frozen=True)
class ActionRecord:
    t: float
    target: str
    action: str
    result: str
    detail: str = ""
    engine: str = ""
    """The engine (data-parallel rank) of the incident it was taken in; empty outside one."""
    incident: str = ""
    """The incident it was taken in (the log lines' ``incident``, its bundles' name): a report
    lists what was tried for its own incident only."""


def taken(t: float, target: str, action: str, result: str, detail: str) -> ActionRecord:
    """The record of an action taken now, in the incident (and of the engine) its task's log
    context names, if any (the supervisor binds both for its ladder: runtime/act/supervisor.py)."""
    where = context()
    engine, incident = where.get("engine") or "", where.get("incident") or ""
    return ActionRecord(t, target, action, result, detail, engine, incident)


def parse_record(line: bytes, now: float) -> ActionRecord | None:
    """One line of the file as a record, or None when it is not one. A ``t`` after ``now``
    becomes ``now``."""
    try:
        doc = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is a ValueError too
        return None
    if not isinstance(doc, dict):
        return None
    t = doc.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    detail = doc.get("detail", "")
    if not all(isinstance(doc.get(k), str) for k in _FIELDS) or not isinstance(detail, str):
        return None
    engine, incident = doc.get("engine", ""), doc.get("incident", "")
    if not isinstance(engine, str) or not isinstance(incident, str):
        return None
    return ActionRecord(
        min(float(t), now), doc["target"], doc["action"], doc["result"], detail, engine, incident
    )


class ActionHistory:
    """Past actions, loaded from and appended to ``path`` (None: memory only).

    Raises :class:`SettingsError` at start when ``path`` exists but cannot be read (a directory,
    no permission): running on would forget the restarts already made.
    """

    def __init__(
        self, path: Path | None, on_write_error: Callable[[OSError], None] | None = None
    ) -> None:
        self.path = path
        self.on_write_error = on_write_error
        """Called for every record that could not be written (the metric counts them)."""
        self.write_errors = 0
        self._failing = False
        self.records: list[ActionRecord] = self._load() if path else []

    def _load(self) -> list[ActionRecord]:
        assert self.path is not None
        try:
            lines = _read_tail(self.path).split(b"\n")[-KEEP_LINES:]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SettingsError(
                f"cannot read the action history {self.path} ({exc.strerror or exc}): "
                "remove or fix it, or choose another --incident-dir"
            ) from None
        now = time.time()
        records, bad = [], 0
        for line in lines:
            if line.strip():
                rec = parse_record(line, now)
                bad += rec is None
                records += [rec] if rec else []
        if bad:
            log.warning(
                "action history %s: %d unreadable records skipped (torn, not UTF-8 JSON, or "
                "without a finite time)",
                self.path,
                bad,
            )
        return records

    def add(self, record: ActionRecord) -> bool:
        """Count ``record`` and append it to the file; False when the file could not take it
        (the record still counts). Never raises: a full disk must not stop recovery."""
        self.records.append(record)
        del self.records[:-KEEP_LINES]
        if self.path is None:
            return True
        doc = {k: v for k, v in asdict(record).items() if v or k not in _OPTIONAL}
        line = json.dumps(doc, separators=(",", ":")) + "\n"
        try:
            _append_line(self.path, line.encode())
        except OSError as exc:
            self._write_failed(exc)
            return False
        if self._failing:
            log.warning("action history %s is written again", self.path)
            self._failing = False
        return True

    def _write_failed(self, exc: OSError) -> None:
        self.write_errors += 1
        if self.on_write_error is not None:
            self.on_write_error(exc)
        if not self._failing:  # once per outage, not once per record
            log.error(
                "cannot write the action history %s (%s): recovery goes on and counts restarts "
                "in memory, but a restarted watchdog will not know them; free space there or "
                "choose another --incident-dir",
                self.path,
                exc.strerror or exc,
            )
            self._failing = True

    def restart_allowed(self, target: str, now: float, limit: RateLimit) -> tuple[bool, str]:
        """(allowed, why not). Counts restarts that were really done (ok or failed)."""
        done = [
            min(r.t, now)  # the clock may have stepped back since the record was made
            for r in self.records
            if r.target == target
            and r.action == Action.RESTART
            and r.result in (Result.OK, Result.FAILED)
            and now - min(r.t, now) < limit.window_s
        ]
        if len(done) >= limit.max_restarts:
            return False, (
                f"{len(done)} restarts in the last {limit.window_s:.0f} s "
                f"(--max-restarts {limit.max_restarts}): not acting until the window passes"
            )
        if done:
            wait = limit.backoff_s * 2 ** (len(done) - 1) - (now - max(done))
            if wait > 0:
                return False, f"backoff: next restart allowed in {wait:.0f} s"
        return True, ""


def _read_tail(path: Path) -> bytes:
    """The file's last READ_TAIL_BYTES, from the first whole line in them."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= READ_TAIL_BYTES:
            return f.read()
        f.seek(size - READ_TAIL_BYTES)
        return f.read().partition(b"\n")[2]


def _append_line(path: Path, data: bytes) -> None:
    """Append one whole line in one write. A file whose last line was torn gets its newline
    first, in the same write."""
    make_private_dirs(path.parent)  # mkdir -p would leave the parents 0755
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        written = os.write(fd, data)
        if written != len(data):  # a full disk: the line is torn, the next one ends it
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
    finally:
        os.close(fd)
