"""The simulator's metrics dialects: series kept as plain numbers, rendered as Prometheus text.

Each engine's dialect (sim/dialects.py) says which series move when; this is what they share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

from engine_watchdog.sim.protocol import IterationStats, SchedulerStats
from engine_watchdog.sim.settings import SimSettings

Labels = tuple[tuple[str, str], ...]


def _line(name: str, labels: Labels, value: float) -> str:
    text = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{text}}} {float(value)}" if text else f"{name} {float(value)}"


def families(table: str) -> dict[str, tuple[str, str]]:
    """``name type help...`` lines -> {name: (type, help)}, in order."""
    rows = (line.split(maxsplit=2) for line in table.strip().splitlines())
    return {name: (kind, doc) for name, kind, doc in rows}


class Dialect:
    """Series kept as plain numbers and rendered as Prometheus text on each scrape."""

    FAMILIES: ClassVar[dict[str, tuple[str, str]]] = {}
    """Sample name (counters with their ``_total``) -> (type, help), in exposition order."""
    STRIP_TOTAL: ClassVar[bool] = True
    """prometheus_client writes a counter's TYPE line without ``_total``; Rust and C++ don't."""
    METRICS_PATH: ClassVar[str] = "/metrics"
    """Where the engine serves its Prometheus text."""
    METRICS_ON_ENGINE_LOOP: ClassVar[bool] = False
    """The engine's /metrics handler waits for its engine loop (llama.cpp): it hangs with it."""
    STATS_PATH: ClassVar[str | None] = None
    """Where the engine serves JSON iteration stats besides its Prometheus text (trtllm-serve)."""

    def __init__(self, settings: SimSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.values: dict[tuple[str, Labels], float] = {}
        self.hists: dict[tuple[str, Labels], list[float]] = {}
        self.latest: dict[int, SchedulerStats] = {}
        self._last_step: dict[int, float] = {}

    def record(self, rank: int, stats: SchedulerStats, it: IterationStats | None) -> None:
        """One engine step of one rank (the vLLM simulator calls this per output batch)."""
        now = self.clock()
        interval = now - self._last_step.get(rank, now)
        self._last_step[rank] = now
        self.step(rank, stats, it, interval)
        self.latest[rank] = stats

    def step(
        self, rank: int, stats: SchedulerStats, it: IterationStats | None, interval: float
    ) -> None:
        raise NotImplementedError

    def refresh(self) -> None:
        """Hook run before each render (gauges computed at scrape time)."""

    def iteration_stats(self) -> list[dict[str, object]]:
        """The JSON answer at ``STATS_PATH``, where the engine has one."""
        return []

    def inc(self, name: str, labels: Labels = (), by: float = 1.0) -> None:
        self.values[(name, labels)] = self.values.get((name, labels), 0.0) + by

    def set(self, name: str, labels: Labels, value: float) -> None:
        self.values[(name, labels)] = value

    def observe(self, name: str, labels: Labels, count: float, total: float) -> None:
        hist = self.hists.setdefault((name, labels), [0.0, 0.0])
        hist[0] += count
        hist[1] += total

    def total(self, field: str) -> float:
        """A SchedulerStats field summed over the ranks' latest steps."""
        return float(sum(getattr(s, field) for s in self.latest.values()))

    def exposition(self) -> bytes:
        if self.settings.disable_log_stats:
            return b""  # the engine's metrics switched off (--enable-metrics absent, ...)
        self.refresh()
        lines: list[str] = []
        for name, (kind, doc) in self.FAMILIES.items():
            samples = self._samples(name, kind)
            if samples:
                strip = self.STRIP_TOTAL and kind == "counter"
                family = name.removesuffix("_total") if strip else name
                lines += [f"# HELP {family} {doc}", f"# TYPE {family} {kind}", *samples]
        return ("\n".join(lines) + "\n").encode() if lines else b""

    def _samples(self, name: str, kind: str) -> list[str]:
        if kind != "histogram":
            return [_line(n, lab, v) for (n, lab), v in sorted(self.values.items()) if n == name]
        out: list[str] = []
        for (n, lab), (count, total) in sorted(self.hists.items()):
            if n == name:
                out.append(_line(f"{name}_bucket", (*lab, ("le", "+Inf")), count))
                out += [_line(f"{name}_count", lab, count), _line(f"{name}_sum", lab, total)]
        return out
