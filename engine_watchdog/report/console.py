"""Transitions as one readable line each, or as JSON lines."""

from __future__ import annotations

import json
import time
from typing import Any

from engine_watchdog.core.model import State, Transition, Verdict


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


def transition_json(change: Transition, target: str) -> str:
    rec = verdict_dict(change.new, target)
    rec["old"] = change.old.value if change.old else None
    return json.dumps(rec, separators=(",", ":"))
