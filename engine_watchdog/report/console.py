"""Transitions as one readable line each, or as JSON lines in the log format of every other
line (host/logs.py): ``ts``, ``level``, ``msg`` and the incident's keys, then the verdict's."""

from __future__ import annotations

import time
from typing import Any

from engine_watchdog.core.model import State, Transition, Verdict
from engine_watchdog.host.logs import json_line

VERDICTS_LOGGER = "engine_watchdog.verdicts"


def clock_text(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 10)}Z"


def verdict_dict(v: Verdict, target: str) -> dict[str, Any]:
    return {
        "t": v.t,
        "target": target,
        "engine": v.engine,
        "state": v.state.value,
        "cause": v.cause,
        "since": v.since,
        "seconds_without_progress": v.seconds_without_progress,
        "last_progress_t": v.last_progress_t,
        "evidence": list(v.evidence),
    }


def transition_line(change: Transition, target: str) -> str:
    return f"{clock_text(change.new.t)} {target} {transition_text(change)}"


def transition_text(change: Transition) -> str:
    """The transition without time or target: ``engine 0: progressing -> stalled (...)``."""
    v = change.new
    old = change.old.value if change.old else "-"
    text = f"engine {v.engine}: {old} -> {v.state.value}"
    if v.cause:
        text += f" ({v.cause})"
    if v.state in (State.SUSPECT, State.STALLED) and v.seconds_without_progress:
        text += f", {v.seconds_without_progress:.1f} s without progress"
    if v.evidence:
        text += "; " + "; ".join(v.evidence)
    return text


def transition_json(change: Transition, target: str, incident: str | None = None) -> str:
    """``incident``: the stall this transition enters, or the one it leaves."""
    rec = verdict_dict(change.new, target)
    rec["old"] = change.old.value if change.old else None
    rec["incident"] = incident
    level = "warning" if change.new.state in (State.SUSPECT, State.STALLED) else "info"
    return json_line(change.new.t, level, VERDICTS_LOGGER, transition_text(change), rec)
