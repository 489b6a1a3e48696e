"""Runs one action the supervisor decided, and writes it down: the history on disk, the log
line and the listeners (metrics, alerts) all see the same outcome, whatever the action did."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from engine_watchdog.core.model import Action, Outcome, Result
from engine_watchdog.recovery.history import ActionHistory, taken

log = logging.getLogger("engine_watchdog.actions")
ActionListener = Callable[[str, Action, str, Outcome | None], None]
"""(target, action, phase "start"|"end", outcome) -> None: metrics, alerts."""


class Ledger:
    """One record per action: dry runs, failures and a bug in an action included."""

    def __init__(
        self,
        history: ActionHistory,
        listeners: list[ActionListener],
        clock: Callable[[], float],
        dry_run: bool,
    ) -> None:
        self.history, self.listeners, self.clock, self.dry_run = history, listeners, clock, dry_run

    async def run(self, target: str, action: Action, job: Coroutine[Any, Any, Outcome]) -> Outcome:
        for listener in self.listeners:
            listener(target, action, "start", None)
        if self.dry_run:
            job.close()  # never awaited: no action is taken
            outcome = Outcome(Result.DRY_RUN, f"would {action}")
        else:
            try:
                outcome = await job
            except Exception as exc:  # a bug in one action must not end the ladder unrecorded
                log.error("action %s raised %r", action, exc)
                outcome = Outcome(Result.FAILED, f"{type(exc).__name__}: {exc}")
        log.warning("action %s: %s %s", action, outcome.result, outcome.detail)
        # Never raises (a full disk): the record still counts in memory, the ladder goes on.
        self.history.add(taken(self.clock(), target, action, outcome.result, outcome.detail))
        for listener in self.listeners:
            listener(target, action, "end", outcome)
        return outcome
