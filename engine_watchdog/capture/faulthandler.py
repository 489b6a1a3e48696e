"""Capture step (opt-in): ask the engine for its own faulthandler stacks through a signal.

A signal without a handler kills (SIGUSR1's default action is to terminate), so the signal is
sent only to processes whose ``SigCgt`` mask in ``/proc/PID/status`` shows a handler for it.
vLLM registers only SIGTERM and SIGINT (vllm/entrypoints/launcher.py), so on a stock engine this
step does nothing;
it serves engines started with ``faulthandler.register(signal.SIGUSR1)``. The stacks go to the
engine's stderr: name its log (``--engine-log``) to get them into the bundle. The step is not in
the default set because a handler for the signal need not be faulthandler's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult, StepStatus
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.probes.pidns import read_status_field

STEP_NAME = "faulthandler"


def signal_caught(sigcgt_hex: str, signum: int) -> bool:
    """Whether a ``SigCgt`` mask (hex, bit n-1 for signal n) has a handler for ``signum``."""
    try:
        return bool(int(sigcgt_hex, 16) >> (signum - 1) & 1)
    except ValueError:
        return False


def has_handler(pid: int, signum: int, proc_root: Path = Path("/proc")) -> bool:
    mask = read_status_field(pid, "SigCgt", proc_root)
    return mask is not None and signal_caught(mask, signum)


def _signal_catchers(
    procs: Sequence[ProcInfo], signum: int, proc_root: Path, send: Callable[[int, int], None]
) -> list[int]:
    """Send ``signum`` to each running process that catches it; the PIDs it went to.
    PermissionError propagates."""
    sent: list[int] = []
    for p in procs:
        # A stopped process would only act on the signal once continued: leave it alone.
        if p.state not in ("running", "sleeping", "disk-wait"):
            continue
        if has_handler(p.pid, signum, proc_root):
            with contextlib.suppress(ProcessLookupError):
                send(p.pid, signum)
                sent.append(p.pid)
    return sent


def faulthandler_step(
    signum: int = signal.SIGUSR1,
    proc_root: Path = Path("/proc"),
    send: Callable[[int, int], None] = os.kill,
) -> CaptureStep:
    """Send ``signum`` to each running engine process that catches it (see module docstring)."""
    name = signal.Signals(signum).name

    async def step(ctx: CaptureContext) -> StepResult:
        t0 = time.monotonic()
        try:
            sent = _signal_catchers(ctx.procs, signum, proc_root, send)
        except PermissionError:
            status: StepStatus = "permission-denied"
            detail = f"sending {name} refused: run as the engine's UID or as root"
        else:
            status = "ok" if sent else "not-available"
            detail = (
                f"sent {name} to PIDs {sent}: their stacks go to the engine's stderr "
                "(engine.log when --engine-log names the log)"
                if sent
                else f"no engine process has a handler for {name} (vLLM registers only SIGTERM "
                f"and SIGINT, and has no self-dump flag): start it with "
                f"faulthandler.register(signal.{name})"
            )
        return StepResult(STEP_NAME, status, detail=detail, elapsed_s=time.monotonic() - t0)

    step.__name__ = STEP_NAME
    return step
