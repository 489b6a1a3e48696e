"""The contract between the bundle writer and each capture step.

A step is ``async def step(ctx: CaptureContext) -> StepResult``: it writes its files under
``ctx.workdir`` (relative names in ``StepResult.files``), never raises for an expected failure,
and stays within ``ctx.timeout_s``. The bundle writer runs steps concurrently, in phases (those
that only look, then those that wake the engine, then a destructive one), and records each
result in the manifest; one failed step never stops the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine_watchdog.core.model import ProcInfo

StepStatus = Literal["ok", "partial", "timeout", "permission-denied", "not-available", "failed"]


@dataclass(frozen=True)
class CaptureContext:
    """What a capture step may use."""

    workdir: Path
    """Temporary bundle directory (renamed into place when every step is done)."""
    procs: tuple[ProcInfo, ...]
    """The engine's processes (API server, engine cores, workers)."""
    destructive: bool = False
    """True only as part of a restart: steps that kill the process (CUDA core dump) may run."""
    timeout_s: float = 20.0
    """Upper bound for the step; each subprocess inside it is bounded by this too."""
    tools: dict[str, str] = field(default_factory=dict)
    """Resolved tool paths by name (py-spy, cuda-gdb); a missing key means not installed."""


@dataclass(frozen=True)
class StepResult:
    name: str
    status: StepStatus
    files: tuple[str, ...] = ()
    detail: str = ""
    """One line for humans; for permission-denied or not-available it names the fix."""
    elapsed_s: float = 0.0


CaptureStep = Callable[[CaptureContext], Awaitable[StepResult]]

WAKES_THE_ENGINE = frozenset({"flight-recorder"})
"""Steps (by ``__name__``) that make the engine run code of its own: PyTorch's flight-recorder
dump thread. The bundle writer runs them after the steps that only look
(py-spy, NVML), so the stacks show the engine as the stall left it. On an H200, a concurrent
py-spy caught PyTorch's dump thread importing torch._dynamo for the dump, and the summary named
it "in a collective" (docs/gpu-verification.md)."""

SAMPLES_AGAIN = frozenset({"peers"})
"""Steps (by ``__name__``) that ptrace the engine's processes again: the multi-node fan-out
(peers/fanout.py) samples the leader's own ranks in-process while it orders the other nodes'.
The bundle writer runs them after the steps that only look, before those that wake the engine,
so two py-spy never attach to one process at once."""
