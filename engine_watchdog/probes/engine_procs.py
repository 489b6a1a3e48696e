"""The per-round process probe: cheap reads of known PIDs, a full discovery now and then.

Discovery scans the whole process table and every socket (about 25 ms here, more on a busy
node); reading the state and CPU time of a few known PIDs costs well under a millisecond. So the
engine's processes are found again only every ``rediscover_s``, or at once when one of them is
gone (a restart brings new PIDs). The socket scan, the dearest part (every socket on the host
read, every descriptor of every process resolved: 130 ms in a guard holding 512 streams on the
device machine, benchmarks/guard.py --profile), is kept between timed rediscoveries while the
processes that listened on the engine's port still live (:class:`KeptListeners`): only a gone
process, or one listener fewer, scans again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import psutil

from engine_watchdog.core.model import ProcInfo, ProcsObs
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.probes.procs import normalise_state, sample_procs, url_port
from engine_watchdog.probes.proctable import ProcTable, PsutilTable, RawProc


class ProcsProbe:
    """Samples one engine's processes (blocking: run it through asyncio.to_thread)."""

    def __init__(
        self,
        url: str | None,
        pids: Sequence[int],
        rediscover_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.pids = tuple(pids)
        self.rediscover_s = rediscover_s
        self.clock = clock
        self._known: dict[int, tuple[ProcInfo, float]] = {}
        self._found_at = -float("inf")
        port = url_port(url) if url and not self.pids else None
        self.table = KeptListeners(PsutilTable(), port)

    def sample(self, profile: EngineProfile) -> ProcsObs:
        """The engine's processes (``profile``: how its titles name their roles)."""
        if not self._known or time.monotonic() - self._found_at >= self.rediscover_s:
            return self._discover(profile)
        infos = []
        for info, created in self._known.values():
            fresh = _read(info, created)
            if fresh is None:
                self.table.forget()  # one is gone: find the engine again, sockets and all, now
                return self._discover(profile)
            infos.append(fresh)
        return ProcsObs(self.clock(), tuple(infos))

    def _discover(self, profile: EngineProfile) -> ProcsObs:
        obs = sample_procs(self.url, self.pids, profile=profile, table=self.table, clock=self.clock)
        self._found_at = time.monotonic()
        self._known = {}
        for p in obs.procs:
            created = _create_time(p.pid)
            if created is not None and p.state != "gone":
                self._known[p.pid] = (p, created)
        return obs


def _create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _read(info: ProcInfo, created: float) -> ProcInfo | None:
    """The process's state and CPU time now; None if it is gone or its PID was reused."""
    try:
        proc = psutil.Process(info.pid)
        with proc.oneshot():
            if proc.create_time() != created:
                return None
            times = proc.cpu_times()
            state = normalise_state(proc.status())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if state in ("zombie", "gone"):
        return None
    return replace(info, state=state, cpu_s=round(times.user + times.system, 3))


class KeptListeners:
    """A process table whose socket scan is kept while the processes that listened on ``port``
    live (the same PIDs, started at the same times). The process list is read anew each time."""

    def __init__(self, table: ProcTable, port: int | None) -> None:
        self.table = table
        self.port = port
        self._kept: tuple[str | None, Mapping[int, frozenset[int]], dict[int, float]] | None = None

    def processes(self) -> Mapping[int, RawProc]:
        return self.table.processes()

    def listeners(self, host: str | None = None) -> Mapping[int, frozenset[int]] | None:
        kept = self._kept
        if kept is not None and kept[0] == host and _all_live(kept[2]):
            return kept[1]
        found = self.table.listeners(host)
        holders = found.get(self.port, frozenset()) if found and self.port is not None else ()
        started = {pid: at for pid in holders if (at := _create_time(pid)) is not None}
        whole = found is not None and bool(holders) and len(started) == len(holders)
        self._kept = (host, found, started) if found is not None and whole else None
        return found

    def forget(self) -> None:
        self._kept = None


def _all_live(started: dict[int, float]) -> bool:
    return all(_create_time(pid) == at for pid, at in started.items())
