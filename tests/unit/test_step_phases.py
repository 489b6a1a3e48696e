"""The order capture steps run in: the fan-out after the steps that only look (no two py-spy
on one process), before those that wake the engine; a destructive step always last."""

from __future__ import annotations

from engine_watchdog.capture.bundle import step_phases
from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult


def _step(name: str) -> CaptureStep:
    async def step(ctx: CaptureContext) -> StepResult:
        return StepResult(name, "ok")

    step.__name__ = name
    return step


def test_the_fan_out_runs_after_the_looks_and_before_the_wakes() -> None:
    steps = [_step(n) for n in ("py-spy", "flight-recorder", "nvml", "peers")]
    assert step_phases(steps, destructive=False) == [[0, 2], [3], [1]]


def test_a_destructive_step_stays_last() -> None:
    steps = [_step(n) for n in ("py-spy", "peers", "cuda-coredump")]
    assert step_phases(steps, destructive=True) == [[0], [1], [2]]
