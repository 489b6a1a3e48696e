"""The action history on disk, and the restart rate limit it enforces.

Kept on disk (JSON Lines, one action per line) so that a restarted watchdog keeps counting: a
crash-looping watchdog must not restart-loop the engine.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from engine_watchdog.capture.tools import make_private_dirs
from engine_watchdog.core.model import Action, Result
from engine_watchdog.core.settings import RateLimit

log = logging.getLogger(__name__)
KEEP_LINES = 1000


@dataclass(frozen=True)
class ActionRecord:
    t: float
    target: str
    action: str
    result: str
    detail: str = ""


class ActionHistory:
    """Past actions, loaded from and appended to ``path`` (None: memory only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: list[ActionRecord] = self._load() if path else []

    def _load(self) -> list[ActionRecord]:
        assert self.path is not None
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()[-KEEP_LINES:]
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                records.append(ActionRecord(**json.loads(line)))
            except (ValueError, TypeError):
                log.warning("action history %s: unreadable line skipped", self.path)
        return records

    def add(self, record: ActionRecord) -> None:
        self.records.append(record)
        if self.path is None:
            return
        make_private_dirs(self.path.parent)  # mkdir -p would leave the parents 0755
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")

    def restart_allowed(self, target: str, now: float, limit: RateLimit) -> tuple[bool, str]:
        """(allowed, why not). Counts restarts that were really done (ok or failed)."""
        done = [
            r.t
            for r in self.records
            if r.target == target
            and r.action == Action.RESTART
            and r.result in (Result.OK, Result.FAILED)
            and now - r.t < limit.window_s
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
