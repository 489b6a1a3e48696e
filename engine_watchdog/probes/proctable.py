"""The host's process table, as the processes probe reads it: psutil on a host, plain data in tests.

Every call blocks (psutil reads ``/proc``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import psutil


@dataclass(frozen=True)
class RawProc:
    """One row of the process table, as read from the host."""

    pid: int
    ppid: int
    cmdline: tuple[str, ...]
    status: str
    cpu_s: float


class ProcTable(Protocol):
    """The host's process table (psutil on a real host, plain data in tests)."""

    def processes(self) -> Mapping[int, RawProc]:
        """Every visible process."""
        ...

    def listeners(self) -> Mapping[int, frozenset[int]]:
        """TCP port -> PIDs holding a listening socket on it (PIDs we may not see are absent)."""
        ...


class PsutilTable:
    """ProcTable backed by psutil."""

    _ATTRS = ("pid", "ppid", "cmdline", "status", "cpu_times")

    def processes(self) -> Mapping[int, RawProc]:
        out: dict[int, RawProc] = {}
        for p in psutil.process_iter(list(self._ATTRS)):
            out[p.pid] = _raw(p.info)
        return out

    def listeners(self) -> Mapping[int, frozenset[int]]:
        by_port: dict[int, set[int]] = {}
        try:
            conns = psutil.net_connections(kind="tcp")
        except psutil.AccessDenied:  # no socket visible: discovery falls back to titles
            return {}
        for c in conns:
            if c.status == psutil.CONN_LISTEN and c.pid is not None and c.laddr:
                by_port.setdefault(c.laddr.port, set()).add(c.pid)
        return {port: frozenset(pids) for port, pids in by_port.items()}


def _raw(info: Mapping[str, Any]) -> RawProc:
    # psutil puts None where it was refused (AccessDenied) or the process vanished mid-read.
    cmdline = info.get("cmdline") or []
    times = info.get("cpu_times")
    cpu = float(times.user + times.system) if times is not None else 0.0
    return RawProc(
        pid=int(info["pid"]),
        ppid=int(info.get("ppid") or 0),
        cmdline=tuple(str(a) for a in cmdline),
        status=str(info.get("status") or "gone"),
        cpu_s=round(cpu, 3),
    )
