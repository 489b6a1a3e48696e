"""Ending a stuck engine so that its supervisor starts it again.

vLLM has no in-place engine-core restart (FACTS.md): SIGKILL of the engine core makes the API
server exit, and whatever runs it (kubelet, systemd, our ``run`` mode) starts it again. Or the
operator gives a ``--restart-command``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Sequence

import psutil

from engine_watchdog.core.model import Outcome, ProcInfo, Result

log = logging.getLogger(__name__)


def _same_process(p: ProcInfo, started_before: float) -> psutil.Process | None:
    """The live process behind ``p``, only if it still is that process (PIDs get reused) and
    it is older than the stall (a newer engine core belongs to an engine that came back)."""
    try:
        proc = psutil.Process(p.pid)
        title = " ".join(proc.cmdline()) or proc.name()
        created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    same = bool(p.title) and title.startswith(p.title.split()[0])
    return proc if same and created < started_before else None


def kill_engine_core(procs: Sequence[ProcInfo], stalled_since: float) -> Outcome:
    """SIGKILL every engine-core process (blocking; call it through asyncio.to_thread)."""
    cores = [p for p in procs if p.role == "engine-core" and p.state not in ("gone", "zombie")]
    if not cores:
        return Outcome(
            Result.SKIPPED,
            "no live engine-core process: the engine already ended, or its processes are not "
            "visible here (pass --pid, or give --restart-command)",
        )
    killed, failed = [], []
    for p in cores:
        proc = _same_process(p, stalled_since)
        if proc is None:
            failed.append(f"{p.pid} (gone, or newer than the stall: not the stuck engine)")
            continue
        try:
            proc.send_signal(signal.SIGKILL)
            killed.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
            failed.append(f"{p.pid} ({type(exc).__name__})")
    if not killed:
        return Outcome(Result.FAILED, "could not kill the engine core: " + ", ".join(failed))
    return Outcome(Result.OK, f"SIGKILL sent to engine core {killed}; its supervisor restarts it")


async def run_restart_command(command: Sequence[str], timeout_s: float) -> Outcome:
    """Run the operator's restart command (no shell), bounded in time."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return Outcome(Result.FAILED, f"--restart-command could not start: {exc}")
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return Outcome(Result.FAILED, f"--restart-command ran past {timeout_s:.0f} s; killed")
    tail = out.decode(errors="replace").strip().splitlines()[-1:] if out else []
    if proc.returncode != 0:
        return Outcome(Result.FAILED, f"--restart-command exited {proc.returncode}: {tail}")
    return Outcome(Result.OK, "--restart-command succeeded")
