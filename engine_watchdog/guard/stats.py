"""The guard's counters and histograms, kept as plain numbers on the hot path (no lock) and read
by Prometheus at scrape time through a collector, the way report/metrics.py reads the verdicts.
Names follow report/metrics.py (``engine_watchdog_``). Which events carry tokens and the gaps
between them are counted by the per-event rules (guard/scan.py), on both paths."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine_watchdog.core.wire import GAP_BOUNDS
from engine_watchdog.guard import scan, tokens
from engine_watchdog.guard.answers import Ending
from engine_watchdog.guard.conns import CLOSE_REASONS
from engine_watchdog.report.metrics import PREFIX

if TYPE_CHECKING:
    from engine_watchdog.guard.exchange import Exchange

FIRST_EVENT_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0)
OUTCOMES = (
    "completed",
    "client-gone",
    "upstream-error",
    "refused",
    "too-large",
    Ending.STUCK.value,
    Ending.STALL.value,
    Ending.SHUTDOWN.value,
)
"""How a request through the guard ended: every one is counted under exactly one."""


class Histogram:
    """Bucket counts and a sum; ``counts[i]`` counts values up to ``bounds[i]``, the last
    bucket the rest."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def family(self, name: str, text: str, target: str) -> HistogramMetricFamily:
        return family(name, text, target, self.bounds, self.counts, self.total)


def family(
    name: str,
    text: str,
    target: str,
    bounds: tuple[float, ...],
    counts: Iterable[int],
    total: float,
) -> HistogramMetricFamily:
    histogram = HistogramMetricFamily(name, text, labels=["target"])
    cumulative, buckets = 0, []
    for bound, n in zip((*map(str, bounds), "+Inf"), counts, strict=True):
        cumulative += n
        buckets.append((bound, float(cumulative)))
    histogram.add_metric([target], buckets, total)
    return histogram


class GuardStats:
    """What the guard counts (the hot path writes these fields directly: :meth:`note`)."""

    __slots__ = (
        "closed",
        "events",
        "finished",
        "first_event",
        "gaps",
        "last_event_t",
        "outcomes",
        "stuck",
        "violations",
    )

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.gaps = scan.new_hist(GAP_BOUNDS)
        """Gaps between a stream's tokens, of every stream (each stream's Progress notes them)."""
        self.first_event = Histogram(FIRST_EVENT_BOUNDS)
        self.events = 0
        """SSE events that carried tokens, of every stream."""
        self.last_event_t: float | None = None
        """When the last of them passed."""
        self.finished = 0
        self.stuck = 0
        """Requests the request judge named stuck (counted whether or not they were aborted)."""
        self.closed = dict.fromkeys(CLOSE_REASONS, 0)
        """Client connections the guard closed itself, by reason (guard/conns.py)."""
        self.violations = 0
        """Requests the guard's self-check found held without moving (guard/held.py)."""

    def end(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self.finished += 1

    def note(self, ex: Exchange, chunk: bytes, now: float) -> None:
        """The hot path: the tokens a read of an SSE stream carried (guard/scan.py: its events
        that carry generated content; keepalives and empty deltas are no progress), their gap
        noted by the stream's Progress, and the first token's wait: the gap histogram and the
        request judge see the same events."""
        n = ex.progress.feed(chunk, now)
        if not n:
            return
        if ex.last_event_t is None:
            ex.first_event_t = now
            ex.engine_id = tokens.engine_id(chunk)
            first = self.first_event
            first.counts[bisect_left(first.bounds, now - ex.started_t)] += 1
            first.total += now - ex.started_t
        ex.last_event_t = self.last_event_t = now
        ex.events += n
        self.events += n

    def credit(self, ex: Exchange, taken: tuple[int, float | None, int]) -> int:
        """What :meth:`note` would have counted for the reads the relay thread passed
        (guard/lanes.py): their tokens and the last one's time (their gaps are in
        :attr:`gaps` already); the reads it passed."""
        events, last_t, reads = taken
        if not events or last_t is None:
            return reads
        ex.events += events
        self.events += events
        ex.last_event_t = last_t
        if self.last_event_t is None or last_t > self.last_event_t:
            self.last_event_t = last_t
        return reads


class GuardCollector(Collector):
    """The guard's series, built at scrape time."""

    def __init__(
        self,
        target: str,
        stats: GuardStats,
        in_flight: Callable[[], int],
        refusing: Callable[[], bool],
        count: Callable[[], None] = lambda: None,
    ) -> None:
        self.target = target
        self.stats = stats
        self.in_flight = in_flight
        self.refusing = refusing
        self.count = count
        """Brings counts kept elsewhere into ``stats`` (the relay thread's: Guard.count)."""

    def collect(self) -> Iterable[Metric]:
        self.count()
        s, t, p = self.stats, self.target, PREFIX + "guard_"
        requests = CounterMetricFamily(
            p + "requests",
            "Requests through the guard by how they ended.",
            labels=["target", "outcome"],
        )
        for outcome, n in s.outcomes.items():
            requests.add_metric([t, outcome], n)
        events = CounterMetricFamily(
            p + "events", "SSE events passed to clients.", labels=["target"]
        )
        events.add_metric([t], s.events)
        stuck = CounterMetricFamily(
            p + "stuck_requests", "Streams the request judge found stuck.", labels=["target"]
        )
        stuck.add_metric([t], s.stuck)
        aborted = CounterMetricFamily(
            p + "aborted_requests",
            "Requests the guard ended itself, by reason (stuck: one stream; stall: the engine).",
            labels=["target", "reason"],
        )
        aborted.add_metric([t, "stuck"], s.outcomes[Ending.STUCK.value])
        aborted.add_metric([t, "stall"], s.outcomes[Ending.STALL.value])
        flight = GaugeMetricFamily(
            p + "in_flight", "Requests in flight through the guard.", labels=["target"]
        )
        flight.add_metric([t], self.in_flight())
        refusing = GaugeMetricFamily(
            p + "refusing", "1 while the guard answers new requests 503.", labels=["target"]
        )
        refusing.add_metric([t], 1 if self.refusing() else 0)
        ttfe = s.first_event.family(
            p + "time_to_first_event_seconds", "From the request to its first SSE event.", t
        )
        counts, total = s.gaps.snapshot()
        gaps = family(
            p + "inter_event_seconds",
            "Between consecutive SSE events of a stream.",
            t,
            s.gaps.bounds,
            counts,
            total,
        )
        yield from (requests, events, stuck, aborted, flight, refusing, ttfe, gaps)
        yield from self._guard_itself()

    def _guard_itself(self) -> Iterable[Metric]:
        """What the guard did on its own account: connections it closed, its self-check."""
        s, t, p = self.stats, self.target, PREFIX + "guard_"
        closed = CounterMetricFamily(
            p + "connections_closed",
            "Client connections the guard closed: no whole request head in time, or past "
            "the cap on idle connections.",
            labels=["target", "reason"],
        )
        for reason, n in s.closed.items():
            closed.add_metric([t, reason], n)
        violations = CounterMetricFamily(
            p + "self_check_violations",
            "Requests the guard held past the per-request threshold plus a probe round without "
            "moving, through its own fault (bytes waiting at the engine, its client taking them), "
            "or after it was ordered to end them.",
            labels=["target"],
        )
        violations.add_metric([t], s.violations)
        yield from (closed, violations)
