"""A supervised engine that outlived its watchdog (``kill -9``, the OOM killer): ended at start.

Two guards, because neither is enough alone:

1. The engine is started through host/pdeathsig.py with SIGTERM: the kernel asks it to stop
   the moment its watchdog dies, even of a SIGKILL, and vLLM's API server then ends its engine
   core and workers. An engine that cannot act on it (hung, stopped) runs on, as may one that
   is still shutting down when the next watchdog starts.
2. ``<incident dir>/engine-<port>.pid`` names the engine the watchdog started: its PID and start
   time, and the watchdog's. A watchdog that starts reads it first. If that engine's process
   group still runs and its watchdog is gone, the group is ended (SIGCONT, SIGTERM, SIGKILL
   after a grace) before a new engine starts: the port is free, and exactly one engine serves.

The orphan is never adopted: its output went to a pipe that died with the old watchdog, and it
is not our child, so its exit could not be waited for. If the watchdog that wrote the file still
runs, it supervises that engine, and starting a second one is refused. Only processes that are
provably that engine's are touched: in its process group and session, of our UID, started no
earlier than it, and none at all when its PID now belongs to a newer process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from engine_watchdog.core.settings import SettingsError
from engine_watchdog.host.tools import make_private_dirs

log = logging.getLogger(__name__)
ORPHAN_GRACE_S = 10.0
KILL_WAIT_S = 5.0
POLL_S = 0.1


@dataclass(frozen=True)
class Stamp:
    engine_pid: int
    engine_started: float
    watchdog_pid: int
    watchdog_started: float


def pid_file(incident_dir: Path, port: int) -> Path:
    return incident_dir / f"engine-{port}.pid"


def write_stamp(path: Path, engine_pid: int) -> None:
    """Record the engine just started (best effort: without it, guard 1 alone remains)."""
    try:
        stamp = Stamp(engine_pid, _started(engine_pid), os.getpid(), _started(os.getpid()))
        make_private_dirs(path.parent)
        part = path.with_name(path.name + ".part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(stamp), f)
        os.replace(part, path)
    except (OSError, psutil.Error) as exc:
        log.warning(
            "cannot write %s (%s): if this watchdog is killed, a new one will not find the "
            "engine it leaves behind",
            path,
            exc,
        )


def remove_stamp(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def end_orphan(path: Path, grace_s: float = ORPHAN_GRACE_S) -> None:
    """End the engine ``path`` names if it outlived its watchdog (blocking). Raises
    :class:`SettingsError` when its watchdog still runs."""
    stamp = _read(path)
    if stamp is None:
        return
    if _alive(stamp.watchdog_pid, stamp.watchdog_started):
        raise SettingsError(
            f"engine-watchdog PID {stamp.watchdog_pid} already supervises the engine named in "
            f"{path}: stop it first, or give this one its own --incident-dir and port"
        )
    members = _engine_group(stamp)
    if members:
        log.warning(
            "the engine an earlier watchdog started (PID %d) still runs without it: ending it "
            "(%d processes) before starting a new one",
            stamp.engine_pid,
            len(members),
        )
        _end(members, grace_s)
    remove_stamp(path)


def _read(path: Path) -> Stamp | None:
    try:
        doc = json.loads(path.read_text())
        return Stamp(
            int(doc["engine_pid"]),
            float(doc["engine_started"]),
            int(doc["watchdog_pid"]),
            float(doc["watchdog_started"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring %s: not a PID file of ours (%s)", path, exc)
        return None


def _started(pid: int) -> float:
    return float(psutil.Process(pid).create_time())


def _alive(pid: int, started: float) -> bool:
    """The process that had ``pid`` when ``started`` still runs (not a reuse of its PID)."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _engine_group(stamp: Stamp) -> list[psutil.Process]:
    """The live processes of the engine's group (it led its own session)."""
    pgid = stamp.engine_pid
    with contextlib.suppress(psutil.Error):
        if psutil.Process(pgid).create_time() != stamp.engine_started:
            return []  # the PID is someone else's now (and so is any group it leads)
    members = []
    for proc in psutil.process_iter(["create_time", "uids", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE or info["uids"] is None:
            continue
        if info["uids"].real != os.getuid() or info["create_time"] < stamp.engine_started:
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(proc.pid) == pgid and os.getsid(proc.pid) == pgid:
                members.append(proc)
    return members


def _end(members: list[psutil.Process], grace_s: float) -> None:
    for sig in (signal.SIGCONT, signal.SIGTERM):
        _signal(members, sig)
    left = _wait_gone(members, grace_s)
    if left:
        log.warning("the orphaned engine ignored SIGTERM for %.0f s: SIGKILL", grace_s)
        _signal(left, signal.SIGKILL)
        _wait_gone(left, KILL_WAIT_S)


def _signal(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)  # psutil checks the PID still is that process


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every one has exited (a zombie has: its parent, not us, reaps it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in procs if _running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
