"""Run engine-watchdog commands as a user does: the installed console script, as a real
subprocess, bounded in time, in its own process group (killed with it when it overruns)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONSOLE_SCRIPT = Path(sys.executable).with_name("engine-watchdog")
"""The console script pip installed beside this Python (pyproject's [project.scripts])."""


@dataclass
class Ran:
    code: int
    out: str
    err: str
    seconds: float

    def json(self) -> dict[str, Any]:
        doc = json.loads(self.out.strip().splitlines()[-1])
        assert isinstance(doc, dict)
        return doc


async def run_cli(*args: str, timeout: float = 120.0, env: dict[str, str] | None = None) -> Ran:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        str(CONSOLE_SCRIPT),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode(), time.monotonic() - started)


def run_cli_sync(
    *args: str,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> Ran:
    """The same, for tests that are not async; ``prefix`` runs the script under another
    program (``setpriv --reuid=...``: as another user)."""
    started = time.monotonic()
    with subprocess.Popen(
        [*prefix, str(CONSOLE_SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return Ran(proc.returncode, out.decode(), err.decode(), time.monotonic() - started)
