"""Replay: the live detector over a recorded trace. Deterministic: same trace, same output."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine_watchdog.detector import Detector, DetectorSettings
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.model import State, Transition
from engine_watchdog.trace import read_trace


def replay(
    lines: Iterable[str], profile: EngineProfile, settings: DetectorSettings
) -> list[Transition]:
    detector = Detector(settings)
    changes: list[Transition] = []
    for obs in read_trace(lines, profile):
        changes += detector.feed(obs)
    return changes


def replay_document(changes: list[Transition]) -> dict[str, Any]:
    """The documented ``replay --json`` shape."""
    stalls = [c.new for c in changes if c.new.state is State.STALLED]
    return {
        "transitions": [
            {"t": c.new.t, "engine": c.new.engine, "state": c.new.state.value, "cause": c.new.cause}
            for c in changes
        ],
        "first_stall_t": stalls[0].t if stalls else None,
        "first_stall_cause": stalls[0].cause if stalls else None,
    }
