"""The detector's settings, its memory of a rank, and its reading of progress and of a quiet
spell (pure functions)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine_watchdog.model import EngineSample, ScrapeObs, State, Verdict
from engine_watchdog.signals import Signals


@dataclass(frozen=True)
class DetectorSettings:
    stall_seconds: float = 30.0
    """Seconds without progress, while work is present, before the verdict is stalled."""
    suspect_seconds: float = 5.0
    """Seconds without progress, while work is present, before the verdict is suspect."""
    startup_grace_seconds: float = 10.0
    """No stalled verdict until this long after the first good scrape."""
    fast_stall_seconds: float = 10.0
    """With strong evidence (engine stopped, GPU spin-waiting, a failed canary): stalled after
    this many seconds without progress instead of --stall-seconds."""
    canary_after_seconds: float = 5.0
    """Ask for a canary once progress has been flat this long with work present."""
    idle_canary_seconds: float = 60.0
    """Ask for a canary this often while the engine looks idle (a wedged idle engine looks idle)."""
    restart_grace_seconds: float = 300.0
    """After the watchdog restarted the engine: how long it is "starting" (not dead) until it
    answers /metrics again. Past this the usual judgement resumes: engine-dead."""
    metrics_from_engine_loop: bool = False
    """The engine's /metrics is answered by its engine loop (llama.cpp's server): /metrics timing
    out for the stall window is then a stall, not an unreachable server."""


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
) -> tuple[State, str | None, str | None]:
    """(state, cause, note) of a rank with work and no progress over ``quiet`` (since, now)."""
    since, t = quiet
    flat = t - since
    graced = t - first_good_t >= cfg.startup_grace_seconds
    strong = signals.strong(since, t) if flat >= cfg.fast_stall_seconds else None
    if graced and (flat >= cfg.stall_seconds or strong):
        finding = signals.cause(since, t)
        note = finding.evidence if finding else None
        if finding and finding.cause in ("stopped", "gpu-spin"):
            return State.STALLED, finding.cause, note
        if (s.running or 0) == 0 and (s.waiting or 0) > 0:
            # Nothing runs, so the engine's CPU is idle too: the admission is the symptom.
            return State.STALLED, "admission-stall", note
        return State.STALLED, finding.cause if finding else "no-progress", note
    if flat >= cfg.suspect_seconds:
        return State.SUSPECT, "no-progress", None
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
