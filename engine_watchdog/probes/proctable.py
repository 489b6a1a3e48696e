"""The host's process table, as the processes probe reads it: psutil on a host, plain data in tests.

Every call blocks (psutil reads ``/proc``).
"""

from __future__ import annotations

import ipaddress
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

    def listeners(self, host: str | None = None) -> Mapping[int, frozenset[int]] | None:
        """TCP port -> PIDs holding a listening socket on it that can serve ``host`` (None: any
        address). A port whose socket's owner cannot be seen (another PID namespace or user)
        maps to no PIDs; None: the socket table itself cannot be read."""
        ...


class PsutilTable:
    """ProcTable backed by psutil."""

    _ATTRS = ("pid", "ppid", "cmdline", "status", "cpu_times")

    def processes(self) -> Mapping[int, RawProc]:
        out: dict[int, RawProc] = {}
        for p in psutil.process_iter(list(self._ATTRS)):
            out[p.pid] = _raw(p.info)
        return out

    def listeners(self, host: str | None = None) -> Mapping[int, frozenset[int]] | None:
        by_port: dict[int, set[int]] = {}
        try:
            conns = psutil.net_connections(kind="tcp")
        except psutil.AccessDenied:  # no socket visible: discovery falls back to titles
            return None
        for c in conns:
            if c.status != psutil.CONN_LISTEN or not c.laddr:
                continue
            ip, port = c.laddr[0], c.laddr[1]
            if host is None or serves(ip, host):
                holders = by_port.setdefault(port, set())
                holders.update([c.pid] if c.pid is not None else [])
        return {port: frozenset(pids) for port, pids in by_port.items()}


def serves(address: str, host: str) -> bool:
    """Whether a socket listening on ``address`` answers connections to ``host``. A port number
    alone is not enough: another process may listen on the same port at another address (a
    torch TCPStore on the host's IP beside a server on 127.0.0.1), and it is not the engine.
    A name other than localhost cannot be resolved here (no lookups): any address may serve it."""
    try:
        bound = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return True
    if bound.is_unspecified:  # 0.0.0.0 or :: serve every address
        return True
    if host.strip("[]").lower() == "localhost":
        return bound.is_loopback or _mapped(bound).is_loopback
    try:
        wanted = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return True
    return _mapped(bound) == _mapped(wanted)


def _mapped(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # ::ffff:127.0.0.1 (a dual-stack socket's view of an IPv4 peer) is 127.0.0.1.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


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
