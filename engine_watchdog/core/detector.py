"""The stall detector: a pure state machine over the observation stream.

Feed observations in time order, get verdict transitions out. No I/O, no clock, no sleeps: time
comes from the observations, so the same code judges a live engine, a recorded trace and a test,
and a verdict on a trace is reproducible bit for bit.
"""

from __future__ import annotations

from dataclasses import replace

from engine_watchdog.core.model import (
    CanaryObs,
    Cause,
    GpuObs,
    GuardObs,
    HealthObs,
    Note,
    Observation,
    ProcsObs,
    Reason,
    RestartObs,
    ScrapeObs,
    State,
    StuckRequest,
    Transition,
    Verdict,
)
from engine_watchdog.core.progress import (
    Counters,
    RestartWindow,
    Track,
    busy_state,
    flapping_note,
    judge_canary,
)
from engine_watchdog.core.requests import RequestJudge
from engine_watchdog.core.settings import DetectorSettings
from engine_watchdog.core.signals import Finding, Signals
from engine_watchdog.core.wire import Wire, held_on_stopped, unanswered_since

__all__ = ["TARGET", "Detector", "DetectorSettings"]

TARGET = "-"
"""Pseudo-engine that carries the verdict before any rank has been seen."""


class Detector:
    """One detector per target (engine server); judges every data-parallel rank on its own."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self.signals = Signals()
        self._tracks: dict[str, Track] = {TARGET: Track(Verdict(0.0, TARGET, State.STARTING))}
        self._first_good_t: float | None = None
        self._last_t: float | None = None
        self._unreachable_since: float | None = None
        self._last_answer_t: float | None = None
        """When the last good scrape ended (its start plus how long it took)."""
        self._reachable_since: float | None = None
        self._health_timeout_since: float | None = None
        self._dead: str | None = None
        self._restart = RestartWindow()
        self.wire = Wire()
        self.requests = RequestJudge()
        self._stuck: list[StuckRequest] = []
        self.notes: list[Note] = []
        """Odd things judged, each kind once (the watcher logs them); data, not logging."""
        self._noted: set[str] = set()

    def judge_with(self, settings: DetectorSettings) -> None:
        """Judge with these settings from the next observation on (the engine was named)."""
        self.settings = settings

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
            self.requests.on_scrape(obs)
            return self._on_scrape_error(obs) if obs.error else self._on_scrape(obs)
        if isinstance(obs, GuardObs):
            return self._on_guard(obs)
        if isinstance(obs, HealthObs):
            return self._on_health(obs)
        if isinstance(obs, RestartObs):
            return self._on_restart(obs)
        if isinstance(obs, CanaryObs):
            self._on_canary(obs)
        if isinstance(obs, ProcsObs | GpuObs | CanaryObs):
            self.signals.add(obs)
        return self._reevaluate(obs.t)

    def take_stuck(self) -> list[StuckRequest]:
        """The requests found stuck since the last call (core/requests.py)."""
        found, self._stuck = self._stuck, []
        return found

    def canary_due(self, t: float) -> str | None:
        """Why a canary request would help now ("stalled", "flat" or "idle"), or None."""
        if self._first_good_t is None or self._unreachable_since is not None:
            return None
        if self._restarting(t):
            return None
        tracks = [k for k in self._tracks.values() if k.last is not None]
        last_sent = self.signals.last_canary_sent()
        if self._way_out_due(tracks, t, last_sent):
            return "stalled"
        unanswered = self._unanswered_since(t)
        if unanswered is not None and (
            last_sent is None
            or last_sent < unanswered
            or t - last_sent >= self.settings.stalled_canary_seconds
        ):
            return "unanswered"
        for k in tracks:
            if k.quiet_since is not None and k.verdict.state is not State.STALLED:
                flat_long = t - k.quiet_since >= self.settings.canary_after_seconds
                if flat_long and (last_sent is None or last_sent < k.quiet_since):
                    return "flat"
        all_idle = bool(tracks) and all(k.verdict.state is State.IDLE for k in tracks)
        idle_since = max((k.verdict.since or t for k in tracks), default=t)
        # Streams the guard holds that the engine does not count: its idle look is no proof (a
        # wedged core stops publishing), so ask as often as while stalled.
        every = (
            self.settings.stalled_canary_seconds
            if self._guard_waits_on_engine()
            else self.settings.idle_canary_seconds
        )
        idle_due = t - idle_since >= self.settings.canary_after_seconds and (
            last_sent is None or t - last_sent >= every
        )
        return "idle" if all_idle and idle_due else None

    def _unanswered_since(self, t: float) -> float | None:
        progress = [k.last_progress_t for k in self._tracks.values()]
        return unanswered_since(self.wire, t, progress)

    def _held_on_stopped(self, t: float) -> str | None:
        """Requests wait for their first token on a rank that looks idle (with one rank: a
        stopped process does not say which rank the requests went to)."""
        ranks = sum(1 for k in self._tracks.values() if k.last is not None)
        since = self._unanswered_since(t) if ranks == 1 else None
        return held_on_stopped(self.wire, self.signals, since, t) if since is not None else None

    def _guard_waits_on_engine(self) -> bool:
        """The guard's last look had streams open and quiet, waiting on the engine."""
        last = self.wire.last
        return last is not None and any(q.waiting_since is not None for q in last.quiet)

    def _way_out_due(self, tracks: list[Track], t: float, last_sent: float | None) -> bool:
        """A stalled verdict (the guard refuses then, so no client proves the engine back), or
        an idle engine whose last canary failed: a canary every stalled_canary_seconds, so the
        verdict can leave as soon as the engine answers one."""
        stalled = any(k.verdict.state is State.STALLED for k in tracks)
        last = self.signals.canaries[-1] if self.signals.canaries else None
        idle_failed = (
            last is not None
            and not last.ok
            and last.is_evidence
            and any(k.verdict.state is State.IDLE for k in tracks)
        )
        every = self.settings.stalled_canary_seconds
        return (stalled or idle_failed) and (last_sent is None or t - last_sent >= every)

    # -- observations ----------------------------------------------------------------------

    def _on_scrape(self, obs: ScrapeObs) -> list[Transition]:
        if self._first_good_t is None:
            self._first_good_t = obs.t
            self._tracks.pop(TARGET, None)
        reconnected = self._unreachable_since is not None
        if reconnected or self._reachable_since is None:
            self._reachable_since = obs.t
        if self._restart.since is not None:
            if self._restarting(obs.t) and not self._restart.new_engine(obs, self._tracks):
                return self._old_engine_answers(obs)
            self._restart.since, self._first_good_t = None, obs.t  # its own start-up grace
        self._unreachable_since = None
        self._last_answer_t = obs.t + (obs.elapsed_s or 0.0)
        changes = []
        for sample in obs.engines:
            track = self._tracks.setdefault(
                sample.engine, Track(Verdict(obs.t, sample.engine, State.STARTING))
            )
            if track.fold(sample, obs.t, reconnected):
                self._note(track, flapping_note(sample.engine))
            changes += self._evaluate(track, obs.t)
        return changes

    def _on_scrape_error(self, obs: ScrapeObs) -> list[Transition]:
        if self._unreachable_since is None:
            self._unreachable_since = obs.t
        stopped = self._engine_stopped(obs)
        if self._first_good_t is None and stopped is None:
            track = self._tracks[TARGET]
            return self._set(track, obs.t, State.STARTING, obs.error, note=obs.detail)
        if self._restarting(obs.t):
            self._restart.gap = True
            return self._set_restarting(obs.t, obs.detail)
        state, cause, note = State.UNREACHABLE, obs.error, obs.detail
        if self._dead is not None or self._engine_gone():
            state, cause = State.STALLED, Cause.ENGINE_DEAD
        elif stopped is not None:
            state, cause, note = State.STALLED, Cause.STOPPED, stopped.evidence
        elif self._api_unresponsive(obs):
            state, cause = State.STALLED, Cause.API_UNRESPONSIVE
        elif self._engine_loop_silent(obs):
            state, cause = State.STALLED, Cause.NO_PROGRESS
        changes = []
        for track in self._tracks.values():
            changes += self._set(track, obs.t, state, cause, note=note)
        return changes

    def _engine_stopped(self, obs: ScrapeObs) -> Finding | None:
        """The engine's processes stopped (state T) through a spell of failed scrapes as long
        as the fast-stall window: llama.cpp's llama-server is its own API server, so a SIGSTOP
        silences /metrics and /health alike, and only the process state tells a stopped engine
        from a lost network. Also before the first good scrape (a check of a stopped server)."""
        assert self._unreachable_since is not None
        if obs.t - self._unreachable_since < self.settings.fast_stall_seconds:
            return None
        return self.signals.stopped(self._unreachable_since)

    def _api_unresponsive(self, obs: ScrapeObs) -> bool:
        """Both /metrics and /health time out for the whole stall window."""
        if obs.error != Cause.TIMEOUT or self._health_timeout_since is None:
            return False
        assert self._unreachable_since is not None
        since = max(self._unreachable_since, self._health_timeout_since)
        return obs.t - since >= self.settings.stall_seconds

    def _engine_loop_silent(self, obs: ScrapeObs) -> bool:
        """/metrics answered by the engine's own loop (llama.cpp) timing out for the whole stall
        window: the loop is hung, whatever /health says. The loop last answered at the end of
        the last good scrape; this one proves it silent until its own timeout."""
        if not self.settings.metrics_from_engine_loop or obs.error != Cause.TIMEOUT:
            return False
        assert self._unreachable_since is not None
        since = self._last_answer_t if self._last_answer_t is not None else self._unreachable_since
        return obs.t + (obs.elapsed_s or 0.0) - since >= self.settings.stall_seconds

    def _on_health(self, obs: HealthObs) -> list[Transition]:
        if obs.error == Cause.TIMEOUT:
            self._health_timeout_since = self._health_timeout_since or obs.t
        else:
            self._health_timeout_since = None
        if obs.status == 503 and self._first_good_t is not None and not self._restarting(obs.t):
            # vLLM answers 503 only once the engine core is known dead
            # (vllm/entrypoints/openai/api_server.py health: EngineDeadError).
            self._dead = "/health answered 503"
            return self._reevaluate(obs.t, force=True)
        if obs.status == 200 and self._dead is not None:
            # Healthy again after being dead: a new engine. What we held against the old one
            # (a failed canary, a quiet clock) says nothing about it.
            self._dead = None
            for track in self._tracks.values():
                track.wedged, track.quiet_since = None, None
                track.note = "/health is 200 again: a new engine"
            return self._reevaluate(obs.t)
        return []

    def _on_restart(self, obs: RestartObs) -> list[Transition]:
        """Nothing of the ended engine counts against the next one: not its death (we caused
        it), nor its processes, canaries or quiet clocks."""
        self._restart = RestartWindow(since=obs.t, gap=obs.replaced)
        self._dead, self._health_timeout_since = None, None
        self.signals = Signals()
        for track in self._tracks.values():
            track.quiet_since, track.wedged, track.moved = None, None, False
            track.counters = Counters()  # the next engine counts from zero: no flapping
        return self._set_restarting(obs.t, obs.detail or None)

    def _old_engine_answers(self, obs: ScrapeObs) -> list[Transition]:
        """The ended engine's API server may serve its last values for a few seconds more."""
        for sample in obs.engines:
            if (track := self._tracks.get(sample.engine)) is not None:
                track.last = sample
        return self._set_restarting(obs.t, None)

    def _restarting(self, t: float) -> bool:
        return self._restart.active(t, self.settings.restart_grace_seconds)

    def _set_restarting(self, t: float, note: str | None) -> list[Transition]:
        return [
            c
            for track in self._tracks.values()
            for c in self._set(track, t, State.STARTING, Cause.RESTARTING, note=note)
        ]

    def _on_canary(self, obs: CanaryObs) -> None:
        judge_canary(obs, [k for k in self._tracks.values() if k.last is not None])

    def _on_guard(self, obs: GuardObs) -> list[Transition]:
        """Events on the wire are progress; one rank's, when there is one (with several, a
        stream does not say which rank served it)."""
        moved = self.wire.add(obs)
        self._stuck += self.requests.judge(obs, self.settings.request_stall_seconds)
        tracks = [k for k in self._tracks.values() if k.last is not None]
        if moved and len(tracks) == 1 and not self._restarting(obs.t):
            track, last = tracks[0], self.wire.last_event_t or obs.t
            track.last_progress_t = max(track.last_progress_t or last, last)
            if track.quiet_since is not None:
                track.quiet_since = max(track.quiet_since, last)
            track.wedged = None
        return self._reevaluate(obs.t)

    def _note(self, track: Track, note: Note) -> None:
        """Say an odd thing once: into the notes (logged) and the rank's next evidence."""
        if note.kind not in self._noted:
            self._noted.add(note.kind)
            self.notes.append(note)
            track.note = note.text

    # -- judgement -------------------------------------------------------------------------

    def _reevaluate(self, t: float, force: bool = False) -> list[Transition]:
        if self._restarting(t):
            return []  # nothing of the ended engine is judged until the next one answers
        if self._unreachable_since is not None and not force:
            if self._first_good_t is None or not self._engine_gone():
                return []  # the last scrape failed: its verdict stands until the next one
            return [c for k in self._tracks.values() for c in self._set_dead(k, t)]
        changes = []
        for track in self._tracks.values():
            if track.last is not None:
                changes += self._evaluate(track, t)
        return changes

    def _evaluate(self, track: Track, t: float) -> list[Transition]:
        assert track.last is not None and self._first_good_t is not None
        s = track.last
        if self._dead or self._engine_gone():
            return self._set_dead(track, t)
        if s.asleep:
            return self._set(track, t, State.SLEEPING, None)
        if track.quiet_since is None:
            if track.wedged is None and (held := self._held_on_stopped(t)) is not None:
                track.wedged, track.note = Cause.STOPPED, held
            if track.wedged is not None:
                return self._set(track, t, State.STALLED, track.wedged)
            # Requests so short that no scrape sees them running still move the counters.
            return self._set(track, t, State.PROGRESSING if track.moved else State.IDLE, None)
        if self.signals.gpu_computing():
            track.quiet_since = t  # "the GPU computes" is a sign of life (long prefill)
        flat = t - track.quiet_since
        assert self._first_good_t is not None
        ranks = sum(1 for k in self._tracks.values() if k.last is not None)
        state, cause, note = busy_state(
            self.settings,
            self.signals,
            s,
            (track.quiet_since, t),
            self._first_good_t,
            self.wire if ranks == 1 else None,
        )
        return self._set(track, t, state, cause, flat, note)

    def _gone_since(self) -> float:
        """Process samples older than the engine's return, or than the last progress seen,
        say nothing about whether the engine core is there now."""
        progress = [k.last_progress_t or 0.0 for k in self._tracks.values()]
        return max([self._reachable_since or 0.0, *progress])

    def _engine_gone(self) -> bool:
        return self.signals.engine_gone(self._gone_since()) is not None

    def _set_dead(self, track: Track, t: float) -> list[Transition]:
        gone = self.signals.engine_gone(self._gone_since())
        note = self._dead or (gone.evidence if gone else None)
        return self._set(track, t, State.STALLED, Cause.ENGINE_DEAD, note=note)

    def _set(
        self,
        track: Track,
        t: float,
        state: State,
        cause: Reason | None,
        flat: float = 0.0,
        note: str | None = None,
    ) -> list[Transition]:
        old = track.verdict
        changed = old.state != state or old.cause != cause
        notes = tuple(n for n in (track.note, note) if n)
        track.verdict = replace(
            old,
            t=t,
            state=state,
            cause=cause,
            since=t if changed else old.since,
            seconds_without_progress=round(flat, 3),
            last_progress_t=track.last_progress_t,
            evidence=notes if changed or notes else old.evidence,
        )
        track.note = None
        return [Transition(old.state, track.verdict)] if changed else []
