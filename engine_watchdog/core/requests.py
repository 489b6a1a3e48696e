"""The request judge: one stream stuck while the others move (pure, beside the detector).

Fed the guard's observations and the engine's scrapes in time order, it names the streams that
have been silent far beyond what the engine does for the others (docs/guard.md):

- the stream has had at least one event: before its first token a request may be queued (the
  engine reports waiting requests), or in a long prefill, and neither is a fault of its own;
- the guard has been waiting on the engine for it, not on its client: a slow reader holds its
  own stream back (back-pressure) and is never stuck;
- its silence is over the threshold: ten times the live 99th-percentile gap between events,
  never under ``--request-stall-seconds`` (core/wire.py explains the factor);
- other streams got events for at least half the threshold after its last one, and within the
  last half: when the whole wire is silent, the engine is the matter (the detector's verdict),
  not one request (a batch that froze together ends its streams microseconds apart);
- and for half the threshold since the wire was last seen silent: after an engine-wide pause
  longer than the threshold, the first stream relayed must not make the next one, a few
  microseconds behind it in the same step, look stuck;
- the engine preempted nothing since the stream's last event while requests wait: a preempted
  request waits to be recomputed, silent, as the others go on.

A slow decode or a very long generation keeps producing events, so it never reaches the
threshold. Each stuck request is named once. Several within :data:`BURST_WINDOW_S` are an
engine-level incident (``burst``).
"""

from __future__ import annotations

from collections import deque

from engine_watchdog.core.model import GuardObs, QuietStream, ScrapeObs, StuckRequest
from engine_watchdog.core.wire import GapWindow

PREEMPTIONS = "preemptions"
"""The engine profiles' progress key of the preemption counter."""
BURST_COUNT = 3
BURST_WINDOW_S = 300.0


class RequestJudge:
    """Per-request verdicts from the guard's observations; time comes from them."""

    def __init__(self) -> None:
        self.gaps = GapWindow()
        self._named: set[str] = set()
        self._recent: deque[float] = deque()
        self._waiting = 0.0
        self._preempted_t: float | None = None
        self._preemptions: float | None = None
        self._wire_quiet_t = -float("inf")
        """When an observation last found the whole wire silent (for half the threshold)."""

    def on_scrape(self, obs: ScrapeObs) -> None:
        if obs.error is not None or not obs.engines:
            return
        self._waiting = sum(e.waiting or 0.0 for e in obs.engines)
        count = sum(e.progress.get(PREEMPTIONS, 0.0) for e in obs.engines)
        if self._preemptions is not None and count > self._preemptions:
            self._preempted_t = obs.t
        self._preemptions = count

    def judge(self, obs: GuardObs, floor_s: float) -> list[StuckRequest]:
        """The streams of this observation newly found stuck; ``floor_s``: the per-request
        threshold's floor (--request-stall-seconds)."""
        self.gaps.add(obs.t, obs.gaps)
        quiet_ids = {q.request_id for q in obs.quiet}
        self._named &= quiet_ids  # a stream that spoke again, or ended, may be judged anew
        threshold = self.gaps.threshold(floor_s)
        if obs.last_event_t is None or obs.t - obs.last_event_t > threshold / 2:
            self._wire_quiet_t = obs.t
        found = []
        for stream in obs.quiet:
            if stream.request_id in self._named:
                continue
            why = self._stuck(stream, obs, threshold)
            if why is not None:
                self._named.add(stream.request_id)
                found.append(self._finding(obs.t, stream, threshold, why))
        return found

    def _stuck(self, s: QuietStream, obs: GuardObs, threshold: float) -> str | None:
        """Why this stream is stuck, or None."""
        if s.last_event_t is None or s.waiting_since is None:
            return None  # before its first event (queued, prefilling), or a slow reader
        silent = obs.t - max(s.last_event_t, s.waiting_since)
        if silent < threshold:
            return None
        newest = obs.last_event_t
        moving_since = max(s.last_event_t, self._wire_quiet_t)
        if newest is None or newest - moving_since < threshold / 2:
            return None  # the others stopped with it (or just came back): the engine's matter
        if obs.t - newest > threshold / 2:
            return None  # nobody moves now
        if self._waiting > 0 and (self._preempted_t or -1.0) >= s.last_event_t:
            return None  # preempted, waiting to be recomputed
        return (
            f"no event for {silent:.1f} s after {s.events} (threshold {threshold:.1f} s) "
            f"while other streams got events {obs.t - newest:.1f} s ago"
        )

    def _finding(self, t: float, s: QuietStream, threshold: float, why: str) -> StuckRequest:
        self._recent.append(t)
        while self._recent and t - self._recent[0] > BURST_WINDOW_S:
            self._recent.popleft()
        burst = len(self._recent) >= BURST_COUNT
        if burst:
            self._recent.clear()  # one incident per burst
        assert s.last_event_t is not None and s.waiting_since is not None
        silent = round(t - max(s.last_event_t, s.waiting_since), 3)
        return StuckRequest(t, s.request_id, silent, threshold, why, burst)
