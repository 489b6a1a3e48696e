"""The detector's settings and its reading of progress between two samples (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from engine_watchdog.model import EngineSample


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
