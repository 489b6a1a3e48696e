"""``/proc/PID/status`` fields, and PIDs across PID namespaces (NVML, containers, sidecars).

One reader of the status file serves every field: ``NSpid`` (a process's PID in each namespace
it belongs to, outermost first), ``Uid``, ``CapEff``, ``SigCgt``... The /proc root is passed in:
a fake one in tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def _status_fields(pid: int | str, proc_root: Path) -> dict[str, str] | None:
    """Every field of ``/proc/PID/status`` (the first of a repeated name), or None if unreadable."""
    try:
        text = (proc_root / str(pid) / "status").read_text(errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key, value.strip())
    return fields


def read_status_field(pid: int | str, name: str, proc_root: Path = PROC) -> str | None:
    """One field of ``/proc/PID/status`` (None when the process or the field is absent)."""
    fields = _status_fields(pid, proc_root)
    return None if fields is None else fields.get(name)


def read_nspid(proc_root: Path, pid: int) -> tuple[int, ...] | None:
    """The ``NSpid`` line of /proc/PID/status (outermost namespace first), or None."""
    fields = _status_fields(pid, proc_root)
    if fields is None:
        return None
    if "NSpid" not in fields:
        return (pid,)  # kernels before 4.1 have no NSpid line: no nested namespace to show
    return tuple(int(x) for x in fields["NSpid"].split())


def read_ns_pid(pid: int, proc_root: Path = PROC) -> int | None:
    """The PID in the process's own namespace (last ``NSpid`` entry) when it differs."""
    ns = read_nspid(proc_root, pid)
    inner = ns[-1] if ns else pid
    return inner if inner != pid else None


def map_pids(nvml_pids: Iterable[int], proc_root: Path) -> dict[int, tuple[int | None, int | None]]:
    """NVML PID -> (PID as we see it, PID inside its own namespace), None where unknown.

    A PID visible in ``proc_root`` maps to itself (NVML and we share the namespace, the common
    case, also for a host-PID sidecar: NSpid then gives the container's PID). Otherwise NVML
    reported a PID from an inner namespace: find the process whose NSpid lists it. A PID from an
    outer (host) namespace cannot be seen from inside a container and stays unmapped.
    """
    out: dict[int, tuple[int | None, int | None]] = {}
    missing: set[int] = set()
    for p in nvml_pids:
        ns = read_nspid(proc_root, p)
        if ns is None:
            missing.add(p)
        else:
            out[p] = (p, ns[-1])
    if missing:
        for ours, ns in _scan_nspids(proc_root):
            for p in missing.intersection(ns[1:]):
                out[p] = (ours, ns[-1])
    for p in missing - out.keys():
        out[p] = (None, None)
    return out


def _scan_nspids(proc_root: Path) -> Iterable[tuple[int, tuple[int, ...]]]:
    try:
        names = [e.name for e in proc_root.iterdir() if e.name.isdigit()]
    except OSError:
        return
    for name in names:
        ns = read_nspid(proc_root, int(name))
        if ns is not None and len(ns) > 1:
            yield int(name), ns
