"""What one GPU sample says the GPU is doing: computing, spinning without doing anything (a
kernel waiting for a peer), idle (the host side is stuck) or unknown. Pure."""

from __future__ import annotations

from typing import Literal

from engine_watchdog.core.model import GpuInfo

GpuClass = Literal["computing", "spinning", "idle", "unknown"]

# Thresholds from docs/gpu-verification.md (seen on an H200, driver 580): a kernel spin-waiting for
# a
# peer showed NVML utilization 100 % with GPM tensor 0.0 % and DRAM bandwidth 0.0 % (SM util 100 %
# for a spin kernel, only 18 % for a stuck NCCL all-reduce, so SM util is not a criterion); a
# host-side deadlock shows utilization 0 %; real decoding shows tensor activity or DRAM traffic.
BUSY_UTIL_MIN_PCT = 90.0
"""NVML utilization at or above this, with no tensor and no DRAM activity: spinning."""
IDLE_UTIL_MAX_PCT = 1.0
"""NVML utilization at or below this (the H200 runs saw exactly 0; 1 tolerates a stray kernel):
idle."""
TENSOR_ACTIVE_MIN_PCT = 1.0
"""GPM tensor activity above this is real work (the spin showed 0.0)."""
DRAM_ACTIVE_MIN_PCT = 1.0
"""GPM DRAM bandwidth above this is real work (the spin showed 0.0; decode is memory-bound)."""


def classify_gpu(info: GpuInfo) -> GpuClass:
    """Computing, spinning, idle or unknown, from one GPU's sample (thresholds above)."""
    if _above(info.tensor_pct, TENSOR_ACTIVE_MIN_PCT) or _above(info.dram_pct, DRAM_ACTIVE_MIN_PCT):
        return "computing"
    if info.util_pct is None:
        return "unknown"
    if info.util_pct <= IDLE_UTIL_MAX_PCT:
        return "idle"
    # Without GPM (before Hopper) a busy GPU cannot be told apart from a spinning one.
    if (
        info.util_pct >= BUSY_UTIL_MIN_PCT
        and info.tensor_pct is not None
        and info.dram_pct is not None
    ):
        return "spinning"
    return "unknown"


def _above(value: float | None, threshold: float) -> bool:
    return value is not None and value > threshold
