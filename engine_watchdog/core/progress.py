"""The detector's memory of a rank, and its reading of progress and of a quiet
spell (pure functions)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from engine_watchdog.core.model import (
    CanaryObs,
    Cause,
    EngineSample,
    Note,
    ScrapeObs,
    State,
    Verdict,
)
from engine_watchdog.core.settings import DetectorSettings
from engine_watchdog.core.signals import Signals
from engine_watchdog.core.wire import Wire, wire_stall


def movement(prev: EngineSample | None, cur: EngineSample) -> tuple[bool, bool]:
    """(moved, reset): did any progress signal move, did any counter go backwards."""
    if prev is None:
        return False, False
    moved = reset = False
    for key, value in cur.progress.items():
        before = prev.progress.get(key)
        if before is None:
            continue
        if key.startswith("~") and value != before:
            moved = True  # a gauge (e.g. an iteration latency): its drops are no restart
        elif value < before:
            reset = True
        elif value > before:
            moved = True
    if cur.kv_usage is not None and prev.kv_usage is not None and cur.kv_usage != prev.kv_usage:
        moved = True
    return moved, reset


FLAP_WINDOW_S = 60.0
"""Counters that go backwards again within this long of their last drop are flapping, not
restarting: an engine start loads a model, so two real restarts never come this close (a
restart the watchdog makes itself is told to the detector and clears this memory)."""


@dataclass(frozen=True)
class Reading:
    """What one sample's counters say, against the rank's memory of them."""

    moved: bool = False
    """A counter passed its highest value since the last restart."""
    reset: bool = False
    """Counters went backwards, taken for a restart of the engine."""
    flapping: bool = False
    """Counters went backwards within FLAP_WINDOW_S of their last drop, or came back to exactly
    their values from before the last restart: neither a restart nor progress; the exposition
    alternates between sources, so its gauges do too."""


@dataclass
class Counters:
    """A rank's counters over time: their last values, their highs since the last restart, the
    values they had before it, and when they last went backwards. Progress is a new high, so
    counters that flap between two sources (a URL that reaches two replicas) pass neither for
    progress nor for restarts, after the first drop (which looks like any restart)."""

    last: dict[str, float] = field(default_factory=dict)
    high: dict[str, float] = field(default_factory=dict)
    before: dict[str, float] = field(default_factory=dict)
    """The values just before the last restart: a counter back at exactly one of them is the
    other source again, not the new engine."""
    reset_t: float | None = None
    drop_t: float | None = None

    def read(self, t: float, sample: EngineSample) -> Reading:
        values = {k: v for k, v in sample.progress.items() if not k.startswith("~")}
        previous = dict(self.last)
        self.last.update(values)
        if any(v < previous[k] for k, v in values.items() if k in previous):
            recent = self.drop_t is not None and t - self.drop_t < FLAP_WINDOW_S
            self.drop_t = t
            if recent:
                return Reading(flapping=True)
            self.reset_t, self.before, self.high = t, previous, dict(values)
            return Reading(reset=True)
        if self._back_to_before(t, values):
            self.drop_t = t
            self.high = {k: max(v, self.before.get(k, v)) for k, v in self.high.items()}
            return Reading(flapping=True)
        moved = False
        for key, value in values.items():
            moved = moved or value > self.high.get(key, value)
            self.high[key] = max(self.high.get(key, value), value)
        recent = self.drop_t is not None and t - self.drop_t < FLAP_WINDOW_S
        return Reading(moved=moved, flapping=recent and self.drop_t != self.reset_t)

    def _back_to_before(self, t: float, values: dict[str, float]) -> bool:
        """Soon after a restart, a counter jumped back to exactly its value from before it."""
        if self.reset_t is None or t - self.reset_t >= FLAP_WINDOW_S:
            return False
        return any(v == self.before.get(k) and v > self.high.get(k, v) for k, v in values.items())


def gauges_moved(prev: EngineSample | None, cur: EngineSample) -> bool:
    """A gauge carrying progress changed, or the KV cache usage did (a long prefill fills it)."""
    if prev is None:
        return False
    for key, value in cur.progress.items():
        if key.startswith("~") and prev.progress.get(key, value) != value:
            return True
    return cur.kv_usage is not None and prev.kv_usage is not None and cur.kv_usage != prev.kv_usage


def hold_unknown(prev: EngineSample | None, cur: EngineSample) -> EngineSample:
    """Work gauges that read no number keep the last number read (a NaN is not zero: zero would
    make a busy engine look idle); with none read yet they stay unknown."""
    if not cur.unknown or prev is None:
        return cur
    running = prev.running if "running" in cur.unknown else cur.running
    waiting = prev.waiting if "waiting" in cur.unknown else cur.waiting
    held = {"running": running, "waiting": waiting}
    still = tuple(name for name in cur.unknown if held[name] is None)
    return replace(cur, running=running, waiting=waiting, unknown=still)


def flapping_note(engine: str) -> Note:
    return Note(
        "flapping-counters",
        f"engine {engine}: counters went back and forth within {FLAP_WINDOW_S:.0f} s: the URL "
        "may reach more than one engine (a Service or load balancer in front of replicas) or "
        "the exposition mixes processes; drops are not taken for restarts and only new highs "
        "count as progress. Point the watchdog at one engine.",
    )


@dataclass
class Track:
    """What the detector remembers of one engine rank."""

    verdict: Verdict
    last: EngineSample | None = None
    quiet_since: float | None = None
    last_progress_t: float | None = None
    wedged: Cause | None = None
    """Stalled while it looks idle, and why (wedged-idle: a canary failed; stopped: requests
    wait for their first token on stopped processes); until a canary or progress says
    otherwise."""
    moved: bool = False
    """The last sample moved a progress signal."""
    note: str | None = None
    counters: Counters = field(default_factory=Counters)

    def fold(self, s: EngineSample, t: float, reconnected: bool) -> bool:
        """Fold a new sample into the memory: movement, restarts, the quiet clock. True when
        the counters flap (the detector says so once)."""
        s = hold_unknown(self.last, s)
        reading = self.counters.read(t, s)
        moved = reading.moved or (not reading.flapping and gauges_moved(self.last, s))
        self.last, self.moved = s, moved
        if reading.reset:
            self.note = "counters went backwards: the engine restarted"
        if moved or reading.reset:
            self.last_progress_t = t
            self.wedged = None
        # Work gauges with no number read yet (NaN): work may be there; the canary settles it.
        work = (s.running or 0) > 0 or (s.waiting or 0) > 0 or bool(s.unknown)
        if s.asleep or not work:
            self.quiet_since = None
        elif moved or reading.reset or reconnected or self.quiet_since is None:
            # A gap in observation is not evidence of a stall: restart the clock after one.
            self.quiet_since = t
        return reading.flapping


def busy_state(
    cfg: DetectorSettings,
    signals: Signals,
    s: EngineSample,
    quiet: tuple[float, float],
    first_good_t: float,
    wire: Wire | None = None,
) -> tuple[State, Cause | None, str | None]:
    """(state, cause, note) of a rank with work and no progress over ``quiet`` (since, now);
    ``wire``: the guard's memory, where its streams are this rank's."""
    since, t = quiet
    flat = t - since
    graced = t - first_good_t >= cfg.startup_grace_seconds
    strong = signals.strong(since, t) if flat >= cfg.fast_stall_seconds else None
    silent = wire_stall(wire, signals, since, t, cfg.wire_stall_seconds) if wire else None
    if graced and silent is not None and not (flat >= cfg.stall_seconds or strong):
        return State.STALLED, silent.cause, silent.evidence
    if graced and (flat >= cfg.stall_seconds or strong):
        finding = signals.cause(since, t)
        note = finding.evidence if finding else None
        if finding and finding.cause in (Cause.STOPPED, Cause.GPU_SPIN):
            return State.STALLED, finding.cause, note
        if (s.running or 0) == 0 and (s.waiting or 0) > 0:
            # Nothing runs, so the engine's CPU is idle too: the admission is the symptom.
            return State.STALLED, Cause.ADMISSION_STALL, note
        return State.STALLED, finding.cause if finding else Cause.NO_PROGRESS, note
    if flat >= cfg.suspect_seconds:
        return State.SUSPECT, Cause.NO_PROGRESS, None
    return State.PROGRESSING, None, None


@dataclass
class RestartWindow:
    """A restart the watchdog made, from the moment it ended the engine until the next engine
    answers /metrics (or the grace ends)."""

    since: float | None = None
    gap: bool = False
    """Whatever answers next is the new engine: /metrics failed since the restart, or the next
    engine was already running when the restart was noted (supervise mode)."""

    def active(self, t: float, grace_s: float) -> bool:
        return self.since is not None and t - self.since < grace_s

    def new_engine(self, obs: ScrapeObs, tracks: Mapping[str, Track]) -> bool:
        """The answer comes from the engine that started after the restart: the old server went
        away since, or the counters began again."""
        if self.gap:
            return True
        pairs = ((tracks.get(s.engine), s) for s in obs.engines)
        return any(k is not None and movement(k.last, s)[1] for k, s in pairs)


def judge_canary(obs: CanaryObs, tracks: list[Track]) -> None:
    """What a canary's answer says of the ranks seen so far."""
    if obs.ok and len(tracks) == 1 and tracks[0].quiet_since is not None:
        # Proof of life. With several ranks the canary's own token shows which one lived.
        tracks[0].quiet_since = obs.t
        tracks[0].note = f"canary completed in {obs.latency_s or 0:.1f} s"
    for k in tracks:
        if obs.ok:
            k.wedged = None
        elif (
            obs.is_evidence
            and k.verdict.state is State.IDLE
            # Sent after the engine went idle and after its last progress: otherwise the
            # engine has shown life since, and the canary's failure is old news.
            and obs.sent >= max(k.verdict.since or 0.0, k.last_progress_t or 0.0)
        ):
            k.wedged = Cause.WEDGED_IDLE
            k.note = f"canary failed ({obs.error}) while the engine looked idle"
