"""Which capture steps a bundle runs: non-destructive ones always, the CUDA core dump only
as part of a restart (it kills the process: FACTS.md)."""

from __future__ import annotations

from engine_watchdog.capture.cuda import make_cuda_coredump_step
from engine_watchdog.capture.pyspy import pyspy_step
from engine_watchdog.capture.step import CaptureStep
from engine_watchdog.probes.gpu import GpuProbe


def capture_steps(destructive: bool, gpu: GpuProbe | None = None) -> list[CaptureStep]:
    steps = [pyspy_step()]
    if destructive:
        steps.append(make_cuda_coredump_step())
    return steps
