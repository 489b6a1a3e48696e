"""Which capture steps a bundle runs: the non-destructive ones always, the CUDA core dump only
as part of a restart (it kills the process: docs/gpu-verification.md)."""

from __future__ import annotations

from engine_watchdog.capture.cuda import make_cuda_coredump_step
from engine_watchdog.capture.flight_recorder import make_flight_recorder_step
from engine_watchdog.capture.gpu_state import make_gpu_step
from engine_watchdog.capture.native import native_step
from engine_watchdog.capture.pyspy import pyspy_step
from engine_watchdog.capture.step import CaptureStep
from engine_watchdog.probes.nvml import GpuProbe

DESTRUCTIVE_STEP_TIMEOUT_S = 90.0
"""A core dump of a large CUDA process took 4.5 s for 119 MB on an H200 (docs/gpu-verification.md);
the step waits for the file to stop growing within 60 % of its timeout."""


def capture_steps(destructive: bool, gpu: GpuProbe | None = None) -> list[CaptureStep]:
    steps = [pyspy_step(), native_step(), make_flight_recorder_step()]
    if gpu is not None:
        steps.append(make_gpu_step(gpu))
    if destructive:  # last: a destructive bundle runs it after the others (it ends the process)
        steps.append(make_cuda_coredump_step())
    return steps
