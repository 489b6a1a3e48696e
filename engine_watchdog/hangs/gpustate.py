"""What one GPU of the bundle was doing, for the ``gpu`` rule: the capture's classification where
it can tell (GPM, Hopper and later), else NVML's own figures, at a weight that says so.

The capture classifies a GPU as spinning only from GPM (no tensor and no DRAM activity while
NVML reads it busy: core/gpu_class.py), so on an RTX A6000, RTX 4090 or RTX 6000 Ada a GPU stuck
in a spin-wait reads "unknown". NVML's utilisation, memory-controller utilisation, SM clock and
power exist on every GPU NVML supports: busy (utilisation at or above 90 %) tells a spin from
idle; no DRAM traffic (memory utilisation at or below 1 %) or a draw under half the power limit
points at a spin rather than real work, which is memory-bound when decoding. Without GPM a spin
reading counts at half weight (:data:`NVML_SPIN_CREDIT`), and the evidence says it was inferred.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_watchdog.hangs.view import GpuView

BUSY_UTIL_MIN_PCT = 90.0
"""NVML utilisation at or above this: the GPU runs a kernel (the capture's own threshold)."""
IDLE_UTIL_MAX_PCT = 1.0
MEM_QUIET_MAX_PCT = 1.0
"""NVML memory utilisation at or below this: no DRAM traffic (a spin; decode reads memory)."""
MEM_WORK_MIN_PCT = 10.0
"""NVML memory utilisation at or above this: memory traffic, real work rather than a spin."""
LOW_POWER_SHARE = 0.5
"""A draw under this share of the power limit, at full utilisation: a spin rather than work."""
NVML_SPIN_CREDIT = 0.5
"""The weight a spin read from NVML alone (no GPM) carries: it may still be real work."""


@dataclass(frozen=True)
class GpuState:
    state: str
    """spinning, computing, idle, busy (spinning or computing, not told apart) or unknown."""
    credit: float = 1.0
    """How much a ``spinning`` rule gets from this reading (1: GPM said so)."""
    how: str = ""
    """How it was read, for the evidence ("" when the capture's classification said it)."""


def gpu_state(g: GpuView) -> GpuState:
    if g.classification in ("spinning", "computing", "idle"):
        return GpuState(g.classification)
    util = g.util_pct
    if util is None:
        return GpuState("unknown")
    if util <= IDLE_UTIL_MAX_PCT:
        return GpuState("idle", how="NVML utilisation")
    if util < BUSY_UTIL_MIN_PCT:
        return GpuState("unknown")
    figures = _figures(g)
    if g.mem_util_pct is not None and g.mem_util_pct >= MEM_WORK_MIN_PCT:
        return GpuState("computing", how=f"NVML only, memory traffic: {figures}")
    quiet = g.mem_util_pct is not None and g.mem_util_pct <= MEM_QUIET_MAX_PCT
    low_power = (
        g.power_w is not None
        and g.power_limit_w is not None
        and g.power_limit_w > 0
        and g.power_w < LOW_POWER_SHARE * g.power_limit_w
    )
    if quiet or low_power:
        why = "no DRAM traffic" if quiet else "low power"
        return GpuState("spinning", NVML_SPIN_CREDIT, f"NVML only, no GPM, {why}: {figures}")
    return GpuState("busy", NVML_SPIN_CREDIT, f"NVML only, no GPM: {figures}")


def matches_state(s: GpuState, wanted: str) -> float:
    """The credit ``s`` gives a rule wanting ``wanted`` (0: it does not hold)."""
    if wanted == "busy":
        return 1.0 if s.state in ("spinning", "computing", "busy") else 0.0
    if wanted in ("spinning", "computing") and s.state == "busy":
        return NVML_SPIN_CREDIT  # busy, and NVML alone cannot say which
    if wanted == "spinning" and s.state == "spinning":
        return s.credit
    return 1.0 if s.state == wanted else 0.0


def _figures(g: GpuView) -> str:
    parts = [f"util {g.util_pct:g} %"]
    if g.mem_util_pct is not None:
        parts.append(f"memory {g.mem_util_pct:g} %")
    if g.sm_clock_mhz is not None:
        parts.append(f"SM {g.sm_clock_mhz:g} MHz")
    if g.power_w is not None:
        limit = f" of {g.power_limit_w:g}" if g.power_limit_w else ""
        parts.append(f"{g.power_w:g}{limit} W")
    return ", ".join(parts)
