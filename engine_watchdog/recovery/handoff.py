"""Handing each finished bundle to the operator's ``--bundle-command`` (to copy it off the node,
for example to object storage), so that the evidence outlives the pod.

The command runs in the background: the capture rung returns as soon as the bundle is in place,
and neither the probe loop nor the ladder waits for an upload. Each run is bounded in time (past
its timeout the command's process group is killed) and written down in the action history as
action ``bundle-command`` with result ``ok``, ``failed`` or ``timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine_watchdog.core.redact import redact_text
from engine_watchdog.host.tools import wait_or_kill
from engine_watchdog.recovery.history import ActionHistory, taken

log = logging.getLogger("engine_watchdog.actions")
ACTION = "bundle-command"
BUNDLE_ENV = "ENGINE_WATCHDOG_BUNDLE"
"""The bundle's path, in the command's environment too (its last argument is the same path)."""
STDERR_TAIL_BYTES = 4096
LINE_CHARS = 300


@dataclass(frozen=True)
class HandOffResult:
    result: str
    """ok | failed | timeout"""
    exit_code: int | None
    duration_s: float
    last_line: str

    def detail(self, bundle: Path) -> str:
        code = "no exit code" if self.exit_code is None else f"exit {self.exit_code}"
        line = f": {self.last_line}" if self.last_line else ""
        return f"{bundle.name}: {code} in {self.duration_s:.1f} s{line}"


async def run_bundle_command(
    command: Sequence[str], bundle: Path, timeout_s: float
) -> HandOffResult:
    """Run ``command bundle`` (no shell), bounded by ``timeout_s``; its stdout is dropped, the
    last line of its stderr kept (redacted: an upload's error may quote a signed URL)."""
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            str(bundle),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: killed whole at the timeout
            env={**os.environ, BUNDLE_ENV: str(bundle)},
        )
    except OSError as exc:
        return HandOffResult("failed", None, time.monotonic() - started, f"cannot start: {exc}")
    err = asyncio.ensure_future(_stderr_tail(proc))
    rc = await wait_or_kill(proc, timeout_s, first=err)
    if rc is None:
        line = f"ran past {timeout_s:g} s; its process group was killed"
        return HandOffResult("timeout", proc.returncode, time.monotonic() - started, line)
    result = "ok" if rc == 0 else "failed"
    return HandOffResult(result, rc, time.monotonic() - started, _last_line(err.result()))


async def _stderr_tail(proc: asyncio.subprocess.Process) -> bytes:
    """Read stderr to its end, keeping only its last bytes (a chatty command stays bounded)."""
    assert proc.stderr is not None
    tail = b""
    while chunk := await proc.stderr.read(65536):
        tail = (tail + chunk)[-STDERR_TAIL_BYTES:]
    return tail


def _last_line(err: bytes) -> str:
    lines = err.decode(errors="replace").strip().splitlines()
    return redact_text(lines[-1].strip())[:LINE_CHARS] if lines else ""


class BundleHandOff:
    """Starts the command on each finished bundle and records its result; never waits for it."""

    def __init__(
        self,
        command: Sequence[str],
        timeout_s: float,
        history: ActionHistory,
        target: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.command, self.timeout_s = tuple(command), timeout_s
        self.history, self.target, self.clock = history, target, clock
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, bundle: Path) -> None:
        task = asyncio.get_running_loop().create_task(self._run(bundle))
        self._tasks.add(task)  # a reference, or the loop may drop the task mid-run
        task.add_done_callback(self._tasks.discard)

    async def _run(self, bundle: Path) -> None:
        done = await run_bundle_command(self.command, bundle, self.timeout_s)
        detail = done.detail(bundle)
        level = logging.INFO if done.result == "ok" else logging.WARNING
        log.log(level, "action %s: %s %s", ACTION, done.result, detail)
        self.history.add(taken(self.clock(), self.target, ACTION, done.result, detail))
