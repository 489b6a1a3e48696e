"""The detector's memory of a rank, and its reading of progress and of a quiet
spell (pure functions)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine_watchdog.core.model import CanaryObs, Cause, EngineSample, ScrapeObs, State, Verdict
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


@dataclass
class Track:
    """What the detector remembers of one engine rank."""

    verdict: Verdict
    last: EngineSample | None = None
    quiet_since: float | None = None
    last_progress_t: float | None = None
    wedged: bool = False
    moved: bool = False
    """The last sample moved a progress signal."""
    note: str | None = None


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
            k.wedged = False
        elif (
            obs.is_evidence
            and k.verdict.state is State.IDLE
            # Sent after the engine went idle and after its last progress: otherwise the
            # engine has shown life since, and the canary's failure is old news.
            and obs.sent >= max(k.verdict.since or 0.0, k.last_progress_t or 0.0)
        ):
            k.wedged = True
            k.note = f"canary failed ({obs.error}) while the engine looked idle"
