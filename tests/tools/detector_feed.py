"""Scripted observation streams for the pure detector's tests (one scrape per second)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine_watchdog.core.detector import Detector
from engine_watchdog.core.model import EngineSample, Observation, Reason, ScrapeObs
from engine_watchdog.core.settings import DetectorSettings

T0 = 1_796_000_000.0


@dataclass
class Eng:
    """A scripted engine rank: counters, gauges; ``step`` advances them like a real one."""

    engine: str = "0"
    running: float = 0
    waiting: float = 0
    kv: float = 0.0
    tokens: float = 0
    asleep: bool = False

    def sample(self) -> EngineSample:
        return EngineSample(
            self.engine,
            self.running,
            self.waiting,
            self.kv,
            self.asleep,
            {"generation_tokens": self.tokens, "iterations": self.tokens},
        )


def scrape(t: float, *engines: Eng) -> ScrapeObs:
    return ScrapeObs(T0 + t, tuple(e.sample() for e in engines), status=200)


def run(
    obs: Sequence[Observation], **settings: Any
) -> tuple[Detector, list[tuple[float, str, Reason | None]]]:
    detector = Detector(DetectorSettings(**settings))
    seen = []
    for o in obs:
        for change in detector.feed(o):
            seen.append((round(change.new.t - T0, 1), change.new.state.value, change.new.cause))
    return detector, seen


def timeline(seconds: int, e: Eng, act: dict[int, object] | None = None) -> Iterator[ScrapeObs]:
    """A scrape per second; ``act[t](e)`` mutates the engine before the scrape at ``t``."""
    for t in range(seconds):
        if act and t in act:
            act[t](e)  # type: ignore[operator]
        yield scrape(t, e)


def decoding(e: Eng) -> None:
    e.running, e.tokens = 2, e.tokens + 10


def first_stall(seen: list[tuple[float, str, Reason | None]]) -> tuple[float, str | None] | None:
    return next(((t, c) for t, s, c in seen if s == "stalled"), None)
