"""Replay: the live detector over a recorded trace. Deterministic: same trace, same output.

A trace says which detector settings it was recorded with (``settings`` records); replay judges
with those, with whatever the caller overrides put over them, so a replay with no overrides
gives the verdicts the live watchdog gave.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from engine_watchdog.core.detector import Detector
from engine_watchdog.core.model import State, StuckRequest, Transition
from engine_watchdog.core.settings import DetectorSettings
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.runtime.trace.format import RecordedSettings, read_trace

Overrides = Callable[[DetectorSettings], DetectorSettings]


@dataclass(frozen=True)
class Judged:
    changes: list[Transition]
    stuck: list[StuckRequest]
    """Requests the request judge found stuck (traces with guard records, core/requests.py)."""
    records: int
    """Records judged (observations and settings); 0: nothing in the trace was usable."""


def judge(
    lines: Iterable[str],
    profile: EngineProfile,
    settings: DetectorSettings | Overrides = lambda s: s,
    follow_engine: bool = False,
) -> Judged:
    """Judge a trace. ``settings``: fixed settings, or overrides put over the ones the trace
    was recorded with (defaults until its first settings record). ``follow_engine``: parse
    scrapes with the engine profile the trace names (the caller did not name one)."""
    overrides = (lambda _: settings) if isinstance(settings, DetectorSettings) else settings
    detector = Detector(overrides(DetectorSettings()))
    changes: list[Transition] = []
    stuck: list[StuckRequest] = []
    records = 0
    for item in read_trace(lines, profile, follow_engine):
        records += 1
        if isinstance(item, RecordedSettings):
            detector.judge_with(overrides(item.detector))
        else:
            changes += detector.feed(item)
            stuck += detector.take_stuck()
    return Judged(changes, stuck, records)


def replay(
    lines: Iterable[str],
    profile: EngineProfile,
    settings: DetectorSettings | Overrides = lambda s: s,
    follow_engine: bool = False,
) -> list[Transition]:
    """The transitions of :func:`judge`."""
    return judge(lines, profile, settings, follow_engine).changes


def replay_document(
    changes: list[Transition], stuck: list[StuckRequest] | None = None
) -> dict[str, Any]:
    """The documented ``replay --json`` shape."""
    stalls = [c.new for c in changes if c.new.state is State.STALLED]
    return {
        "stuck_requests": [
            {"t": s.t, "request_id": s.request_id, "silent_s": s.silent_s, "burst": s.burst}
            for s in stuck or ()
        ],
        "transitions": [
            {"t": c.new.t, "engine": c.new.engine, "state": c.new.state.value, "cause": c.new.cause}
            for c in changes
        ],
        "first_stall_t": stalls[0].t if stalls else None,
        "first_stall_cause": stalls[0].cause if stalls else None,
    }
