"""Processes probe: find an engine's processes and read their state and CPU time.

Discovery starts from the server's listening port (the API server) and adds its descendants
(engine cores, workers), the other children of the engine's own launcher where it starts the
API server and the engine side by side (TGI), and orphaned title-matched engine processes (an
engine core whose API server died is still ours; one with a live parent belongs to that
parent's engine). Where no socket listens on the URL's port at its address, nothing is taken:
a wrong URL must not capture another engine, nor a process that listens on the same port at
another address. Where the socket is there but its owner is hidden (another user or PID
namespace: a sidecar of another UID), the title matches are taken if they make one engine, and
none if they make several (which one serves the URL cannot be told). Where the socket table
cannot be read at all, every title match is taken.
Explicit PIDs (``--pid``) replace the port and bring their descendants.

Host access is passed in: ``table`` (a :class:`ProcTable`, psutil by default) and ``proc_root``
(for ``/proc/PID/status`` reads), so unit tests use plain data and a fake ``/proc``. Every call
here blocks (psutil reads ``/proc``): async callers use :func:`sample_procs_async`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from engine_watchdog.core.model import ProcInfo, ProcsObs
from engine_watchdog.core.redact import redact_argv
from engine_watchdog.engines import VLLM, EngineProfile
from engine_watchdog.probes.pidns import read_ns_pid
from engine_watchdog.probes.proctable import ProcTable, PsutilTable, RawProc

ROLE_ORDER = ("engine-core", "worker", "dp-coordinator", "api-server", "other")

# Role from the title's name after "::" so a custom VLLM_PROCESS_NAME_PREFIX still classifies.
# psutil status names -> the six states the detector knows (ProcInfo.state); any other status
# (idle, waking, parked...) is a kind of sleep. A process held by a debugger, or mid py-spy
# dump (tracing-stop), makes no progress either: stopped.
_STATES = {
    "running": "running",
    "disk-sleep": "disk-wait",
    "stopped": "stopped",
    "tracing-stop": "stopped",
    "zombie": "zombie",
    "dead": "zombie",
    "gone": "gone",
}

TITLE_MAX = 256

FIX_NOT_FOUND = (
    "check --url (the engine's own port), or run the watchdog where it sees the engine's "
    "processes and sockets (Kubernetes: a sidecar in the engine's pod with "
    "shareProcessNamespace: true), or pass --pid"
)


@dataclass(frozen=True)
class Discovery:
    """Which processes make up the engine, and why some may be missing."""

    pids: tuple[int, ...]
    listening: frozenset[int] = frozenset()
    """PIDs holding the URL's listening socket (the API server)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    orphans: frozenset[int] = frozenset()
    """Title-matched PIDs outside the server's tree (their parent gone), with descendants."""


def url_port(url: str) -> int:
    """The TCP port of an http(s) URL (default 80/443). Raises ValueError for a bad URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL with a host: {url!r}")
    return parts.port or (443 if parts.scheme == "https" else 80)


def url_host(url: str) -> str:
    """The host part of an http(s) URL, as written (an IP or a name)."""
    return urlsplit(url).hostname or ""


def title_of(cmdline: Sequence[str]) -> str:
    """The process title: setproctitle rewrites argv, so the joined command line is the title."""
    return " ".join(a for a in cmdline if a).strip()[:TITLE_MAX]


def classify_role(title: str, profile: EngineProfile, listening: bool = False) -> str:
    """api-server | engine-core | worker | dp-coordinator | other, from the title (the
    profile's title keywords), or the command line for engines that set no title."""
    if any(title.startswith(prefix) for prefix in profile.process_titles):
        name = title.rsplit("::", 1)[-1]
        for keyword, role in profile.title_roles:
            if name.startswith(keyword):
                return role
    for fragment, role in profile.cmdline_roles:
        if fragment in title:
            return role
    if listening or any(m in title for m in profile.process_cmdline_markers):
        return "api-server"
    return "other"


def normalise_state(status: str) -> str:
    """psutil status -> running | sleeping | disk-wait | stopped | zombie | gone."""
    return _STATES.get(status, "sleeping")


def _children_map(procs: Mapping[int, RawProc]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    return children


def _descendants(roots: Iterable[int], children: Mapping[int, list[int]]) -> set[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, ()))
    return seen


def _ancestors(pid: int, procs: Mapping[int, RawProc]) -> list[int]:
    out: list[int] = []
    cur = procs.get(pid)
    while cur is not None and cur.ppid not in (0, cur.pid) and len(out) < 64:
        out.append(cur.ppid)
        cur = procs.get(cur.ppid)
    return out


def select_pids(
    procs: Mapping[int, RawProc],
    listeners: Mapping[int, frozenset[int]] | None,
    profile: EngineProfile,
    port: int | None = None,
    explicit: Sequence[int] = (),
) -> Discovery:
    """Pure discovery over a process-table snapshot (see the module docstring for the rules);
    ``listeners`` as :meth:`ProcTable.listeners` gives them for the URL's host."""
    children = _children_map(procs)
    if explicit:
        members = _descendants(explicit, children) | set(explicit)
        return Discovery(pids=_ordered(members, procs, profile))
    listening = (listeners or {}).get(port, frozenset()) if port is not None else frozenset()
    hidden = port is not None and listeners is not None and not listening
    if hidden and port not in (listeners or {}):
        # No socket on this port: a wrong URL, not someone else's engine.
        return Discovery((), notes=(f"nothing listens on port {port} at the URL's address",))
    # Several API servers share one socket: keep the topmost holders as roots.
    roots = {p for p in listening if not set(_ancestors(p, procs)) & listening}
    members = _descendants(roots | _launched_with(roots, procs, children, profile), children)
    tree = set(members)
    for p in procs.values():
        if p.pid in members or not title_of(p.cmdline).startswith(profile.process_titles):
            continue
        # With a listener, only orphans (parent gone: reparented to init, or invisible) join;
        # a title match with a live parent belongs to whichever engine that parent runs.
        if not listening or p.ppid <= 1 or p.ppid not in procs:
            members |= _descendants([p.pid], children)
    orphans = frozenset(members - tree) if listening else frozenset()
    notes = () if listening or port is None else ("the socket table is not readable: used titles",)
    if hidden:  # the socket is there, its owner hidden: as a sidecar of another UID sees it
        engines = _engines_among(members, procs, profile)
        if engines > 1:  # which one serves the URL cannot be told
            return Discovery(
                (), notes=(f"{_hidden(port)}, and {engines} engines match the titles",)
            )
        notes = (f"{_hidden(port)}: its engine found by title",)
    ordered = _ordered(members, procs, profile, frozenset(listening))
    return Discovery(ordered, frozenset(listening), notes, orphans)


def _hidden(port: int | None) -> str:
    return f"the process listening on port {port} is not visible (another user or PID namespace)"


def _engines_among(
    members: Iterable[int], procs: Mapping[int, RawProc], profile: EngineProfile
) -> int:
    """How many engines the title-matched processes make: the topmost of them (their parent no
    title match) grouped by that parent (an API server, or init for orphans)."""
    titled = {
        p
        for p in members
        if p in procs and title_of(procs[p].cmdline).startswith(profile.process_titles)
    }
    return len({procs[p].ppid for p in titled if procs[p].ppid not in titled})


def _launched_with(
    roots: Iterable[int],
    procs: Mapping[int, RawProc],
    children: Mapping[int, list[int]],
    profile: EngineProfile,
) -> set[int]:
    """Siblings of the API server started by the engine's own launcher (TGI's launcher starts
    the router and the shards side by side): the launcher's other children. The launcher
    itself stays out: it is a supervisor, not part of the engine a restart may kill."""
    if not profile.launcher_cmdline_markers:
        return set()
    out: set[int] = set()
    for root in roots:
        for pid in _ancestors(root, procs):
            raw = procs.get(pid)
            if raw and any(m in title_of(raw.cmdline) for m in profile.launcher_cmdline_markers):
                out.update(children.get(pid, ()))
                break
    return out


def _ordered(
    pids: Iterable[int],
    procs: Mapping[int, RawProc],
    profile: EngineProfile,
    listening: frozenset[int] = frozenset(),
) -> tuple[int, ...]:
    def key(pid: int) -> tuple[int, int]:
        raw = procs.get(pid)
        title = title_of(raw.cmdline) if raw else ""
        return ROLE_ORDER.index(classify_role(title, profile, pid in listening)), pid

    return tuple(sorted(pids, key=key))


def proc_info(
    pid: int,
    raw: RawProc | None,
    profile: EngineProfile,
    listening: bool = False,
    proc_root: Path = Path("/proc"),
    orphan: bool = False,
) -> ProcInfo:
    """ProcInfo for one PID; ``raw`` None means the process is gone."""
    if raw is None:
        return ProcInfo(pid=pid, ppid=0, role="other", title="", state="gone", cpu_s=0.0)
    # Redacted here, where a command line becomes part of what the watchdog keeps (titles reach
    # traces, bundles, summaries): the raw table never leaves discovery. Only the engine's few
    # processes pay for it, not the whole host's table every round.
    title = title_of(redact_argv(raw.cmdline))
    return ProcInfo(
        pid=pid,
        ppid=raw.ppid,
        role=classify_role(title, profile, listening),
        title=title,
        state=normalise_state(raw.status),
        cpu_s=raw.cpu_s,
        ns_pid=read_ns_pid(pid, proc_root),
        orphan=orphan,
    )


def discover(
    url: str | None = None,
    pids: Sequence[int] = (),
    *,
    profile: EngineProfile = VLLM,
    table: ProcTable | None = None,
) -> tuple[Discovery, Mapping[int, RawProc]]:
    """Find the engine's processes from ``url``'s port, or from explicit ``pids``; also returns
    the process-table snapshot it used. Blocking."""
    table = table if table is not None else PsutilTable()
    port = url_port(url) if url and not pids else None
    listeners = table.listeners(url_host(url)) if url and port is not None else None
    snapshot = table.processes()
    return select_pids(snapshot, listeners, profile, port=port, explicit=pids), snapshot


def sample_procs(
    url: str | None = None,
    pids: Sequence[int] = (),
    *,
    profile: EngineProfile = VLLM,
    table: ProcTable | None = None,
    proc_root: Path = Path("/proc"),
    clock: Callable[[], float] = time.time,
) -> ProcsObs:
    """Discover the engine's processes and read each one's state and CPU time. Blocking.

    An explicit PID that does not exist is reported with state ``gone``.
    """
    found, snapshot = discover(url, pids, profile=profile, table=table)
    wanted = list(found.pids) + [p for p in pids if p not in found.pids]
    infos = tuple(
        proc_info(
            pid, snapshot.get(pid), profile, pid in found.listening, proc_root, pid in found.orphans
        )
        for pid in wanted
    )
    return ProcsObs(t=clock(), procs=infos)


async def sample_procs_async(
    url: str | None = None,
    pids: Sequence[int] = (),
    *,
    profile: EngineProfile = VLLM,
    table: ProcTable | None = None,
    proc_root: Path = Path("/proc"),
    clock: Callable[[], float] = time.time,
) -> ProcsObs:
    """:func:`sample_procs` off the event loop."""
    return await asyncio.to_thread(
        sample_procs, url, pids, profile=profile, table=table, proc_root=proc_root, clock=clock
    )
