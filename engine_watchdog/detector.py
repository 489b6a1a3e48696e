"""The stall detector: a pure state machine over the observation stream.

Feed observations in time order, get verdict transitions out. No I/O, no clock, no sleeps: time
comes from the observations, so the same code judges a live engine, a recorded trace and a test,
and a verdict on a trace is reproducible bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine_watchdog.model import (
    EngineSample,
    HealthObs,
    Observation,
    ScrapeObs,
    State,
    Transition,
    Verdict,
)

TARGET = "-"
"""Pseudo-engine that carries the verdict before any rank has been seen."""

# Scrape errors that mean "the API answers nothing in time", as opposed to "nothing is there".
_TIMEOUTS = frozenset({"timeout"})


@dataclass(frozen=True)
class DetectorSettings:
    stall_seconds: float = 30.0
    """Seconds without progress, while work is present, before the verdict is stalled."""
    suspect_seconds: float = 5.0
    """Seconds without progress, while work is present, before the verdict is suspect."""
    startup_grace_seconds: float = 10.0
    """No stalled verdict until this long after the first good scrape."""


@dataclass
class _Track:
    """What the detector remembers of one engine rank."""

    verdict: Verdict
    last: EngineSample | None = None
    quiet_since: float | None = None
    last_progress_t: float | None = None
    evidence: tuple[str, ...] = field(default_factory=tuple)


class Detector:
    """One detector per target (engine server); judges every data-parallel rank on its own."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self._tracks: dict[str, _Track] = {TARGET: _Track(Verdict(0.0, TARGET, State.STARTING))}
        self._first_good_t: float | None = None
        self._last_t: float | None = None
        self._unreachable_since: float | None = None
        self._health_timeout_since: float | None = None
        self._dead_since: float | None = None

    @property
    def verdicts(self) -> dict[str, Verdict]:
        """The current verdict of every rank (or of the target before any rank is known)."""
        return {e: t.verdict for e, t in self._tracks.items()}

    def feed(self, obs: Observation) -> list[Transition]:
        """Judge one observation; return the state changes it caused."""
        if self._last_t is not None and obs.t < self._last_t:
            return []  # out of order: time must not run backwards inside a verdict
        self._last_t = obs.t
        if isinstance(obs, ScrapeObs):
            return self._on_scrape(obs)
        if isinstance(obs, HealthObs):
            return self._on_health(obs)
        return []

    # -- scrapes ---------------------------------------------------------------------------

    def _on_scrape(self, obs: ScrapeObs) -> list[Transition]:
        if obs.error is not None:
            return self._on_scrape_error(obs)
        if self._first_good_t is None:
            self._first_good_t = obs.t
            self._tracks.pop(TARGET, None)
        reconnected = self._unreachable_since is not None
        self._unreachable_since = None
        changes = []
        for sample in obs.engines:
            track = self._tracks.get(sample.engine)
            if track is None:
                track = _Track(Verdict(obs.t, sample.engine, State.STARTING))
                self._tracks[sample.engine] = track
            changes += self._judge(track, sample, obs.t, reconnected)
        return changes

    def _judge(
        self, track: _Track, s: EngineSample, t: float, reconnected: bool
    ) -> list[Transition]:
        prev = track.last
        track.last = s
        moved, reset = _movement(prev, s)
        work = (s.running or 0) > 0 or (s.waiting or 0) > 0
        if self._dead_since is not None:
            # A dying API server still serves its frozen metrics for a few seconds.
            return self._set(track, t, State.STALLED, "engine-dead")
        if reset:
            track.evidence = ("counters went backwards: the engine restarted",)
        if moved or reset:
            track.last_progress_t = t
        if s.asleep or not work:
            track.quiet_since = None
            state = State.SLEEPING if s.asleep else State.IDLE
            return self._set(track, t, state, None)
        if moved or reset or reconnected or track.quiet_since is None:
            # A gap in observation is not evidence of a stall: restart the clock after one.
            track.quiet_since = t
        flat = t - track.quiet_since
        state, cause = self._busy_state(s, t, flat)
        return self._set(track, t, state, cause, flat)

    def _busy_state(self, s: EngineSample, t: float, flat: float) -> tuple[State, str | None]:
        assert self._first_good_t is not None
        graced = t - self._first_good_t >= self.settings.startup_grace_seconds
        if flat >= self.settings.stall_seconds and graced:
            admission = (s.running or 0) == 0 and (s.waiting or 0) > 0
            return State.STALLED, "admission-stall" if admission else "no-progress"
        if flat >= self.settings.suspect_seconds:
            return State.SUSPECT, "no-progress"
        return State.PROGRESSING, None

    def _on_scrape_error(self, obs: ScrapeObs) -> list[Transition]:
        if self._unreachable_since is None:
            self._unreachable_since = obs.t
        if self._first_good_t is None:
            track = self._tracks[TARGET]
            return self._set(track, obs.t, State.STARTING, obs.error, detail=obs.detail)
        state, cause = State.UNREACHABLE, obs.error
        if self._dead_since is not None:
            state, cause = State.STALLED, "engine-dead"
        elif self._api_unresponsive(obs):
            state, cause = State.STALLED, "api-unresponsive"
        changes = []
        for track in self._tracks.values():
            changes += self._set(track, obs.t, state, cause, detail=obs.detail)
        return changes

    def _api_unresponsive(self, obs: ScrapeObs) -> bool:
        """Both /metrics and /health time out for the whole stall window."""
        if obs.error not in _TIMEOUTS or self._health_timeout_since is None:
            return False
        assert self._unreachable_since is not None
        since = max(self._unreachable_since, self._health_timeout_since)
        return obs.t - since >= self.settings.stall_seconds

    # -- health ----------------------------------------------------------------------------

    def _on_health(self, obs: HealthObs) -> list[Transition]:
        if obs.error in _TIMEOUTS:
            if self._health_timeout_since is None:
                self._health_timeout_since = obs.t
        else:
            self._health_timeout_since = None
        if obs.status == 503 and self._first_good_t is not None:
            # vLLM answers 503 only once the engine core is known dead (FACTS.md).
            self._dead_since = self._dead_since or obs.t
            changes = []
            for track in self._tracks.values():
                changes += self._set(
                    track, obs.t, State.STALLED, "engine-dead", detail="/health 503"
                )
            return changes
        if obs.status == 200:
            self._dead_since = None
        return []

    # -- bookkeeping -----------------------------------------------------------------------

    def _set(
        self,
        track: _Track,
        t: float,
        state: State,
        cause: str | None,
        flat: float = 0.0,
        detail: str | None = None,
    ) -> list[Transition]:
        old = track.verdict
        evidence = track.evidence + ((detail,) if detail else ())
        changed = old.state != state or old.cause != cause
        track.verdict = replace(
            old,
            t=t,
            state=state,
            cause=cause,
            since=t if changed else old.since,
            seconds_without_progress=round(flat, 3),
            last_progress_t=track.last_progress_t,
            evidence=evidence[-5:],
        )
        track.evidence = ()
        return [Transition(old.state, track.verdict)] if changed else []


def _movement(prev: EngineSample | None, cur: EngineSample) -> tuple[bool, bool]:
    """(moved, reset): did any progress signal move, did any counter go backwards."""
    if prev is None:
        return False, False
    moved = reset = False
    for key, value in cur.progress.items():
        before = prev.progress.get(key)
        if before is None:
            continue
        if value < before:
            reset = True
        elif value > before:
            moved = True
    if cur.kv_usage is not None and prev.kv_usage is not None and cur.kv_usage != prev.kv_usage:
        moved = True
    return moved, reset
