"""The per-round process probe: cheap reads of known PIDs, a full discovery now and then.

Discovery scans the whole process table and every socket (about 25 ms here, more on a busy
node); reading the state and CPU time of a few known PIDs costs well under a millisecond. So the
engine's processes are found again only every ``rediscover_s``, or at once when one of them is
gone (a restart brings new PIDs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import psutil

from engine_watchdog.core.model import ProcInfo, ProcsObs
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.probes.procs import normalise_state, sample_procs


class ProcsProbe:
    """Samples one engine's processes (blocking: run it through asyncio.to_thread)."""

    def __init__(
        self,
        url: str | None,
        pids: Sequence[int],
        profile: EngineProfile,
        rediscover_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.pids = tuple(pids)
        self.profile = profile
        self.rediscover_s = rediscover_s
        self.clock = clock
        self._known: dict[int, tuple[ProcInfo, float]] = {}
        self._found_at = -float("inf")

    def sample(self) -> ProcsObs:
        if not self._known or time.monotonic() - self._found_at >= self.rediscover_s:
            return self._discover()
        infos = []
        for info, created in self._known.values():
            fresh = _read(info, created)
            if fresh is None:
                return self._discover()  # one is gone: find the engine again, now
            infos.append(fresh)
        return ProcsObs(self.clock(), tuple(infos))

    def _discover(self) -> ProcsObs:
        obs = sample_procs(self.url, self.pids, profile=self.profile, clock=self.clock)
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
