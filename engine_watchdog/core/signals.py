"""Evidence beyond the metrics: processes, GPUs, canaries. Pure, like the detector it serves.

The detector asks two questions of it: is there strong evidence of a stall since the engine
went quiet (enough to call it before --stall-seconds), and what is the most specific cause.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TypeVar

from engine_watchdog.core.gpu_class import classify_gpu
from engine_watchdog.core.model import CanaryObs, Cause, GpuInfo, GpuObs, ProcInfo, ProcsObs

_Obs = TypeVar("_Obs", ProcsObs, GpuObs, CanaryObs)
HISTORY_SECONDS = 900.0
ENGINE_ROLES = ("engine-core", "worker")
CPU_IDLE_CORES = 0.05
"""Engine CPU below this (cores) while requests wait: nothing runs, a host-side deadlock."""
CPU_BUSY_CORES = 0.4
"""One engine process above this (cores) with no progress: busy doing nothing useful. Well under
a full core: a spinning engine got only 0.48-0.65 of one on a loaded 2-core machine."""


@dataclass(frozen=True)
class Finding:
    cause: Cause
    evidence: str


class Signals:
    """A bounded history of non-metrics observations, and pure questions about it."""

    def __init__(self) -> None:
        self.procs: deque[ProcsObs] = deque()
        self.gpus: deque[GpuObs] = deque()
        self.canaries: deque[CanaryObs] = deque()
        self.engine_seen = False
        self.core_seen = False
        """An engine-core process was seen: then it alone keeps the engine alive (its workers
        may outlive it for a moment). Where none ever was (a plain torch rank titled
        ``VLLM::Worker_TP0`` serving the API, a worker watched with --pid), its workers do."""

    def add(self, obs: ProcsObs | GpuObs | CanaryObs) -> None:
        if isinstance(obs, ProcsObs):
            _append(self.procs, obs)
            engine = _engine_procs(obs)
            self.engine_seen = self.engine_seen or bool(engine)
            self.core_seen = self.core_seen or any(p.role == "engine-core" for p in engine)
        elif isinstance(obs, GpuObs):
            _append(self.gpus, obs)
        else:
            _append(self.canaries, obs)

    # -- questions -------------------------------------------------------------------------

    def engine_gone(self, since: float) -> Finding | None:
        """The engine core was seen, and the last two process samples since ``since`` lack it
        (two: one sample can miss it in a discovery race); for an engine seen without a core,
        the same of its workers."""
        window = [p for p in self.procs if p.t >= since][-2:]
        if not self.engine_seen or len(window) < 2:
            return None
        needed = ("engine-core",) if self.core_seen else ENGINE_ROLES
        for sample in window:
            live = [p for p in _engine_procs(sample) if p.state not in ("gone", "zombie")]
            if any(p.role in needed for p in live):
                return None
        what = "engine-core process is" if self.core_seen else "engine's worker processes are"
        return Finding(Cause.ENGINE_DEAD, f"the {what} gone")

    def gpu_computing(self) -> bool:
        """The latest sample shows an engine GPU computing (tensor or DRAM activity)."""
        return bool(self.gpus) and any(
            classify_gpu(g) == "computing" for g in self._engine_gpus(self.gpus[-1])
        )

    def strong(self, since: float, t: float) -> Finding | None:
        """Evidence since ``since`` that makes waiting for --stall-seconds pointless.

        A failed canary counts when nothing contradicts it: an engine whose processes work (CPU)
        or whose GPU computes while the canary waits may just be slow (a step every 25 s
        outlasts an 8 s canary). While it waits, not since the spell began: the last step's own
        CPU (a real vLLM's CPU worker burned 0.7 s in the second after its engine core blocked)
        would otherwise hide an idle engine for many seconds more."""
        hard = self._stopped(since) or self._gpu_spin(since)
        if hard is not None:
            return hard
        failed = self.canary_failed_since(since)
        if failed is None or self._busy_elsewhere(failed.sent):
            return None  # a busy engine may be in a long step: wait for --stall-seconds
        return Finding(Cause.NO_PROGRESS, f"canary request failed: {failed.error}")

    def cause(self, since: float, t: float) -> Finding | None:
        """The most specific cause the evidence since ``since`` supports: processes and GPUs
        name a cause; a failed canary only says no-progress."""
        hard = self._stopped(since) or self._gpu_spin(since)
        return hard or self._cpu(since, t) or self._canary_failed(since)

    def host_quiet(self, since: float) -> Finding | None:
        """The engine's processes, sampled since ``since``, stopped; or idle (and none in disk
        wait) with no GPU computing. None when they say otherwise, or say nothing."""
        hard = self._stopped(since) or self._gpu_spin(since)
        if hard is not None:
            return hard
        window = [p for p in self.procs if p.t >= since]
        if any(p.state == "disk-wait" for w in window for p in _engine_procs(w)):
            return None
        rate = self._max_cpu_rate(since)
        if rate is None or rate > CPU_IDLE_CORES or self.gpu_computing():
            return None
        return Finding(Cause.HOST_DEADLOCK, f"engine CPU {rate:.2f} cores and GPU idle")

    def _busy_elsewhere(self, since: float) -> bool:
        rate = self._max_cpu_rate(since)
        return (rate is not None and rate > CPU_IDLE_CORES) or self.gpu_computing()

    def canary_failed_since(self, since: float) -> CanaryObs | None:
        for c in reversed(self.canaries):
            if c.sent < since:
                return None
            if not c.ok and c.is_evidence:
                return c
        return None

    def last_canary_sent(self) -> float | None:
        return self.canaries[-1].sent if self.canaries else None

    # -- evidence --------------------------------------------------------------------------

    def stopped(self, since: float) -> Finding | None:
        """The same engine process stopped (state T) in the last two samples since ``since``."""
        return self._stopped(since)

    def _stopped(self, since: float) -> Finding | None:
        """The last two process samples since ``since`` show the same engine process stopped.

        Two, because a ptrace stop for a stack dump is brief; py-spy's shows as tracing-stop.
        """
        window = [p for p in self.procs if p.t >= since][-2:]
        if len(window) < 2:
            return None
        stopped = set.intersection(
            *({p.pid for p in _engine_procs(w) if p.state == "stopped"} for w in window)
        )
        if not stopped:
            return None
        return Finding(Cause.STOPPED, f"engine process(es) {sorted(stopped)} stopped (state T)")

    def _gpu_spin(self, since: float) -> Finding | None:
        window = [g for g in self.gpus if g.t >= since]
        if len(window) < 2:
            return None
        for obs in window:
            classes = {classify_gpu(g) for g in self._engine_gpus(obs)}
            if "spinning" not in classes or "computing" in classes:
                return None
        return Finding(Cause.GPU_SPIN, "GPU busy with no tensor or DRAM activity: a spin-wait")

    def _canary_failed(self, since: float) -> Finding | None:
        failed = self.canary_failed_since(since)
        if failed is None:
            return None
        return Finding(Cause.NO_PROGRESS, f"canary request failed: {failed.error}")

    def _cpu(self, since: float, t: float) -> Finding | None:
        rate = self._max_cpu_rate(since)
        if rate is None:
            return None
        gpu_idle = not self.gpus or all(
            classify_gpu(g) in ("idle", "unknown") for g in self._engine_gpus(self.gpus[-1])
        )
        if rate <= CPU_IDLE_CORES and gpu_idle:
            return Finding(Cause.HOST_DEADLOCK, f"engine CPU {rate:.2f} cores and GPU idle")
        if rate >= CPU_BUSY_CORES:
            return Finding(Cause.HOST_BUSY, f"an engine process at {rate:.2f} cores, no progress")
        return None

    def _max_cpu_rate(self, since: float) -> float | None:
        """Highest CPU rate (cores) of one engine process over the window."""
        window = [p for p in self.procs if p.t >= since]
        if len(window) < 2 or window[-1].t - window[0].t < 1.0:
            return None
        first = {p.pid: p.cpu_s for p in _engine_procs(window[0])}
        dt = window[-1].t - window[0].t
        rates = [(p.cpu_s - first[p.pid]) / dt for p in _engine_procs(window[-1]) if p.pid in first]
        return max(rates) if rates else None

    def _engine_gpus(self, obs: GpuObs) -> tuple[GpuInfo, ...]:
        """GPUs the engine's processes use; all of them when that is unknown."""
        pids = {p.pid for p in _engine_procs(self.procs[-1])} if self.procs else set()
        mine = tuple(g for g in obs.gpus if pids & set(g.pids))
        return mine or obs.gpus


def _append(history: deque[_Obs], obs: _Obs) -> None:
    history.append(obs)
    while obs.t - history[0].t > HISTORY_SECONDS:
        history.popleft()


def _engine_procs(obs: ProcsObs) -> list[ProcInfo]:
    # An orphan beside a known server may be another engine's: neither its stop nor its life
    # is ours (probes/procs.py).
    return [p for p in obs.procs if p.role in ENGINE_ROLES and not p.orphan]
