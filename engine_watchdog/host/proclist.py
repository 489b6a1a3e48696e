"""The host's processes as recovery sees them after a group restart: who owns each, which
session it belongs to, which files it holds; and a signal that reaches only the process that
was listed (recovery/node_clean.py). psutil and /proc on a host; plain data in tests.

Every call blocks (it reads ``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

FileId = tuple[int, int]
"""(st_dev, st_ino): a file, whatever mount namespace names it and however."""


@dataclass(frozen=True)
class HostProc:
    """One process of the host's table."""

    pid: int
    ppid: int
    uid: int
    """The real UID (-1 where it could not be read)."""
    sid: int
    """Its session (-1 where it could not be read)."""
    status: str
    """psutil's status names: running, sleeping, stopped, zombie, ..."""
    started: float
    """Its start time (seconds since the epoch): a PID reused later has another."""
    name: str = ""


class ProcessList(Protocol):
    """The host's processes (psutil on a real host, plain data in tests)."""

    def processes(self) -> Mapping[int, HostProc]:
        """Every visible process."""
        ...

    def holders(self, files: Iterable[FileId]) -> Mapping[FileId, frozenset[int]]:
        """For each file, the PIDs that map it or hold it open."""
        ...

    def signal(self, proc: HostProc, sig: signal.Signals) -> bool:
        """Send ``sig`` to ``proc`` if its PID still is that process; False if it is gone."""
        ...


class PsutilProcesses:
    """ProcessList backed by psutil and ``/proc``."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def processes(self) -> Mapping[int, HostProc]:
        out: dict[int, HostProc] = {}
        for p in psutil.process_iter(["ppid", "uids", "status", "create_time", "name"]):
            info = p.info
            uids = info.get("uids")
            sid = -1
            with contextlib.suppress(OSError):
                sid = os.getsid(p.pid)
            out[p.pid] = HostProc(
                pid=p.pid,
                ppid=int(info.get("ppid") or 0),
                uid=int(uids.real) if uids is not None else -1,
                sid=sid,
                status=str(info.get("status") or "gone"),
                started=float(info.get("create_time") or 0.0),
                name=str(info.get("name") or ""),
            )
        return out

    def holders(self, files: Iterable[FileId]) -> Mapping[FileId, frozenset[int]]:
        wanted = set(files)
        found: dict[FileId, set[int]] = {f: set() for f in wanted}
        if not wanted:
            return {}
        for pid_dir in self.proc_root.iterdir():
            if not pid_dir.name.isdigit():
                continue
            for held in _mapped(pid_dir) | _open(pid_dir):
                if held in found:
                    found[held].add(int(pid_dir.name))
        return {f: frozenset(pids) for f, pids in found.items()}

    def signal(self, proc: HostProc, sig: signal.Signals) -> bool:
        try:
            live = psutil.Process(proc.pid)
            if live.create_time() != proc.started:
                return False  # the PID is another process's now
            live.send_signal(sig)
        except psutil.Error:
            return False
        return True


def _mapped(pid_dir: Path) -> set[FileId]:
    """Files a process maps (/proc/PID/maps: the device as major:minor in hex, the inode)."""
    out: set[FileId] = set()
    try:
        text = (pid_dir / "maps").read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[4] == "0":
            continue
        major, _, minor = fields[3].partition(":")
        with contextlib.suppress(ValueError):
            out.add((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
    return out


def _open(pid_dir: Path) -> set[FileId]:
    out: set[FileId] = set()
    try:
        fds = list((pid_dir / "fd").iterdir())
    except OSError:
        return out
    for fd in fds:
        with contextlib.suppress(OSError):
            st = fd.stat()  # follows the link to the file itself
            out.add((st.st_dev, st.st_ino))
    return out
