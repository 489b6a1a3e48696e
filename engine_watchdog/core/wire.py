"""What the guard sees on the wire, remembered for the detector and the request judge (pure).

Events on the wire are the most direct proof of progress there is: a token the client got. The
guard (guard/) reports them once a round as a :class:`GuardObs`; this module keeps a short
memory of them and answers three questions:

- how long is "far beyond" the engine's own pace: ``factor`` times the 99th percentile of the
  gaps between consecutive events of a stream over the last :data:`GAP_WINDOW_S` seconds, and
  never under a floor (:meth:`GapWindow.threshold`);
- has the wire gone silent with streams open (:class:`Wire`), which, with the engine's
  processes idle or stopped and its metrics flat, is a stall within seconds
  (:func:`wire_stall`);
- do requests wait for their first token on an engine that shows nothing
  (:func:`unanswered_since`): then it is probed at once, and its processes stopped are a stall
  (:func:`held_on_stopped`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine_watchdog.core.model import Cause, GuardObs
from engine_watchdog.core.signals import Signals

GAP_BOUNDS: tuple[float, ...] = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0),
)
"""Upper bounds (seconds) of the inter-event gap buckets; one more bucket holds the rest. Also
the buckets of the guard's inter-event histogram (its metrics)."""
GAP_WINDOW_S = 60.0
"""The live distribution is the gaps of the last minute: long enough for a slow engine's pace
(a step every 10 s gives six gaps per stream), short enough to follow a change of load."""
GAP_FACTOR = 10.0
"""A silence is "far beyond" the engine's pace at ten times its 99th-percentile gap: a healthy
stream's gaps come from one distribution (the engine's step time, shared by the whole batch),
so ten times the slowest percent is a silence it does not make by itself."""
MIN_GAPS = 20
"""Fewer gaps than this in the window: no distribution, the floor alone decides."""
FRESH_S = 3.0
"""A guard observation older than this says nothing about the wire now."""
AWAITING_PROBE_S = 1.5
"""A request the guard has held this long without its first token, while nothing moved for as
long (no event on the wire, no progress in the metrics), has the engine probed at once
(docs/guard.md, "Before the first token"): a probe round and a half, so that a scrape after
its arrival could have shown the engine at work, and one a second apart always does."""


def gap_bucket(gap_s: float) -> int:
    """The bucket index of one gap (the guard's hot path calls this once per chunk)."""
    return bisect_left(GAP_BOUNDS, gap_s)


class GapWindow:
    """The inter-event gaps of the last :data:`GAP_WINDOW_S` seconds, as bucket counts."""

    def __init__(self) -> None:
        self._rounds: deque[tuple[float, tuple[int, ...]]] = deque()
        self._totals = [0] * (len(GAP_BOUNDS) + 1)

    def add(self, t: float, gaps: tuple[int, ...]) -> None:
        if any(gaps):
            counts = tuple(gaps[: len(self._totals)])
            self._rounds.append((t, counts))
            for i, n in enumerate(counts):
                self._totals[i] += n
        while self._rounds and t - self._rounds[0][0] > GAP_WINDOW_S:
            _, old = self._rounds.popleft()
            for i, n in enumerate(old):
                self._totals[i] -= n

    def p99(self) -> float | None:
        """The 99th-percentile gap (its bucket's upper bound), None with too few gaps."""
        total = sum(self._totals)
        if total < MIN_GAPS:
            return None
        seen = 0
        for i, n in enumerate(self._totals):
            seen += n
            if seen >= 0.99 * total:
                return GAP_BOUNDS[i] if i < len(GAP_BOUNDS) else 2 * GAP_BOUNDS[-1]
        return 2 * GAP_BOUNDS[-1]

    def threshold(self, floor_s: float) -> float:
        p99 = self.p99()
        return floor_s if p99 is None else max(floor_s, GAP_FACTOR * p99)


@dataclass(frozen=True)
class WireStall:
    cause: Cause
    evidence: str


class Wire:
    """The detector's memory of the guard's observations."""

    def __init__(self) -> None:
        self.gaps = GapWindow()
        self.last: GuardObs | None = None
        self.last_event_t: float | None = None
        self.open_since_event = False
        """Streams that have had events were open at some observation since the last event:
        the silence is theirs (it stays so once they are answered and closed)."""

    def add(self, obs: GuardObs) -> bool:
        """Remember one observation; True when it shows progress (events or ended requests)."""
        self.last = obs
        self.gaps.add(obs.t, obs.gaps)
        if obs.last_event_t is not None:
            self.last_event_t = max(self.last_event_t or obs.last_event_t, obs.last_event_t)
        if obs.events > 0:
            self.open_since_event = False
        self.open_since_event |= obs.decoding > 0
        return obs.events > 0 or obs.finished > 0

    def awaiting_since(self, t: float) -> float | None:
        """When the oldest request the guard holds without a first token came (a fresh
        observation), or None."""
        last = self.last
        if last is None or t - last.t > FRESH_S or last.awaiting == 0:
            return None
        return last.awaiting_since

    def silent_streams(self, t: float) -> bool:
        """The guard reports (a fresh observation), and streams were open in the silence."""
        return self.last is not None and t - self.last.t <= FRESH_S and self.open_since_event


def wire_stall(
    wire: Wire, signals: Signals, quiet_since: float | None, t: float, floor_s: float
) -> WireStall | None:
    """Stalled on the wire's evidence: streams open and silent beyond the engine's pace, the
    metrics flat for half that (``quiet_since``), and the engine's processes stopped, or idle
    with no GPU computing. Without process evidence (a guard far from the engine) the wire
    alone never calls a stall this early: a long step looks the same from outside.

    An engine process stopped (state T) since the last event is silent whatever its pace: the
    pace only tells a slow step from a lost one, and a stopped process takes no step at all.
    So there the floor alone is the window. Ten times the p99 gap would put a real vLLM on
    2 CPU cores, whose p99 gap is 0.5-1 s under load (new requests' prefills hold a step),
    at 10 s, no sooner than the metrics' own --fast-stall-seconds."""
    if quiet_since is None or wire.last_event_t is None or not wire.silent_streams(t):
        return None
    since = wire.last_event_t
    finding = signals.host_quiet(since)
    if finding is None:
        return None
    window = floor_s if finding.cause is Cause.STOPPED else wire.gaps.threshold(floor_s)
    silent = t - since
    if silent < window or t - quiet_since < window / 2:
        return None
    note = f"no event on the wire for {silent:.1f} s with streams open; {finding.evidence}"
    return WireStall(finding.cause, note)


def unanswered_since(wire: Wire, t: float, progress: Iterable[float | None]) -> float | None:
    """When the oldest request the guard holds without its first token came, where it and the
    engine have both been quiet for AWAITING_PROBE_S (no event on the wire, no ``progress``
    of the metrics: the ranks' last): the engine may be frozen without a word (a wedged core
    publishes nothing), so it is probed at once. None otherwise: a request queued behind
    others that move is the engine's ordinary work."""
    since = wire.awaiting_since(t)
    if since is None:
        return None
    moved = [wire.last_event_t, *progress]
    quiet_from = max([since, *(m for m in moved if m is not None)])
    return since if t - quiet_from >= AWAITING_PROBE_S else None


def held_on_stopped(wire: Wire, signals: Signals, since: float, t: float) -> str | None:
    """Requests have waited for their first token since ``since`` on an engine that does not
    count them, and its processes are stopped: a stall, whatever the metrics say; the
    evidence, or None."""
    stopped = signals.stopped(since)
    if stopped is None:
        return None
    n = wire.last.awaiting if wire.last is not None else 0
    return f"{n} request(s) waiting {t - since:.1f} s for a first token; {stopped.evidence}"
