"""Ending a stuck engine so that its supervisor starts it again.

vLLM has no in-place engine-core restart (vLLM #48966): SIGKILL of the engine core makes the API
server exit, and whatever runs it (kubelet, systemd, our ``run`` mode) starts it again. Or the
operator gives a ``--restart-command``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from engine_watchdog.core.model import Outcome, ProcInfo, Result
from engine_watchdog.host.tools import make_private_dirs, wait_or_kill

log = logging.getLogger(__name__)
TAIL_BYTES = 4096
TAIL_CHARS = 300
RESTART_LOG = "restart-command.log"
"""In the incident directory: the last restart command's output."""


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


@dataclass(frozen=True)
class Owner:
    """Whose processes a restart may kill: the engine's UID (its process tree is discovery's:
    probes/procs.py marks the title-matched orphans beside it)."""

    uid: int
    """Only processes of this UID (the watchdog's own unless --engine-uid says otherwise)."""


def _not_ours(p: ProcInfo, proc: psutil.Process, owner: Owner) -> str | None:
    """Why ``proc`` is not the watched engine's to kill, or None when it is."""
    try:
        uid = proc.uids().real
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    if uid != owner.uid:
        return f"UID {uid}, not {owner.uid}: pass --engine-uid {uid} if it is the engine's user"
    if p.orphan:
        return "an orphan outside the engine's process tree (another engine's?)"
    return None


def kill_engine_core(procs: Sequence[ProcInfo], stalled_since: float, owner: Owner) -> Outcome:
    """SIGKILL every engine-core process that is the watched engine's: older than the stall,
    of the engine's UID, in its process tree (blocking; call it through asyncio.to_thread)."""
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
        why = "gone, or newer than the stall" if proc is None else _not_ours(p, proc, owner)
        if proc is None or why is not None:
            failed.append(f"{p.pid} ({why}: not killed)")
            continue
        try:
            proc.send_signal(signal.SIGKILL)
            killed.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
            failed.append(f"{p.pid} ({type(exc).__name__})")
    if not killed:
        return Outcome(Result.FAILED, "could not kill the engine core: " + ", ".join(failed))
    spared = f"; spared {', '.join(failed)}" if failed else ""
    return Outcome(
        Result.OK, f"SIGKILL sent to engine core {killed}; its supervisor restarts it{spared}"
    )


async def run_restart_command(
    command: Sequence[str], timeout_s: float, log_path: Path | None = None
) -> Outcome:
    """Run the operator's restart command (no shell), bounded in time.

    The command itself is waited for, never what it leaves running: a command that starts the
    engine in the background (``&``, ``setsid``, a daemon) has done its job when it exits. Its
    output goes to ``log_path`` (emptied first), not to a pipe: a child left running holds its
    copy of the command's stdout, so waiting for a pipe to close waits for the engine, and a
    pipe no one reads any more kills a writer with SIGPIPE. Past ``timeout_s`` the command's own
    process group is killed; what it detached (a new session) is not in it.
    """
    out = _open_output(log_path)
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return Outcome(Result.FAILED, f"--restart-command could not start: {exc}")
    finally:
        if out != asyncio.subprocess.DEVNULL:
            os.close(out)  # the command has its own copy
    rc = await wait_or_kill(proc, timeout_s)
    if rc is None:
        return Outcome(Result.FAILED, f"--restart-command ran past {timeout_s:.0f} s; killed")
    if rc != 0:
        return Outcome(Result.FAILED, f"--restart-command exited {rc}: {_last_line(log_path)}")
    return Outcome(Result.OK, "--restart-command succeeded")


def _open_output(log_path: Path | None) -> int:
    """A descriptor for the command's output: ``log_path`` emptied, else /dev/null."""
    if log_path is None:
        return asyncio.subprocess.DEVNULL
    try:
        make_private_dirs(log_path.parent)
        return os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    except OSError as exc:  # a full or read-only disk must not stop the restart
        log.warning("--restart-command output not kept: cannot write %s (%s)", log_path, exc)
        return asyncio.subprocess.DEVNULL


def _last_line(log_path: Path | None) -> str:
    """The last line the command wrote (its error, usually), for the outcome."""
    if log_path is None:
        return "(output not kept)"
    try:
        with log_path.open("rb") as f:
            f.seek(max(os.fstat(f.fileno()).st_size - TAIL_BYTES, 0))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "(output unreadable)"
    return lines[-1][:TAIL_CHARS] if lines else "(no output)"
