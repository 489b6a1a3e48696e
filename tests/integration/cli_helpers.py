"""Run engine-watchdog commands as real subprocesses, bounded, in their own process group."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any


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


async def run_cli(*args: str, timeout: float = 120.0) -> Ran:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engine_watchdog",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
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
