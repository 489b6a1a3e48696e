"""GPU probe: NVML (and GPM on Hopper and later) per GPU, the processes on it, and Xid events.

The NVML module is passed in (``pynvml`` from nvidia-ml-py on a real host, a small fake in unit
tests) and so is ``/proc``: the same code runs on a GPU machine and in CI. Every call blocks:
the watch loop runs :meth:`GpuProbe.sample` through ``asyncio.to_thread``.

Each sample is classified by the pure :func:`engine_watchdog.core.gpu_class.classify_gpu`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_watchdog.core.gpu_class import GpuClass, classify_gpu
from engine_watchdog.core.model import GpuInfo, GpuObs
from engine_watchdog.probes.gpm import Device, GpmSampler
from engine_watchdog.probes.pidns import map_pids
from engine_watchdog.probes.xid import XidEvent, XidEvents

# NVML ids (nvml.h); numbers rather than module attributes so older nvidia-ml-py releases and
# the test fake need not define every name.
NVML_CLOCK_SM = 1


@dataclass(frozen=True)
class GpuProcess:
    """A compute process NVML lists on a GPU."""

    nvml_pid: int
    """The PID as NVML reports it (a host PID when the driver does not translate)."""
    pid: int | None
    """The same process in our PID namespace (``/proc`` as we see it); None if not visible."""
    ns_pid: int | None
    """Its PID inside its own (innermost) namespace, from ``NSpid`` (the container's PID)."""
    used_memory_bytes: int | None


@dataclass(frozen=True)
class GpuReading:
    """One GPU's sample, with what :class:`GpuInfo` does not carry."""

    info: GpuInfo
    mem_util_pct: float | None = None
    sm_clock_mhz: int | None = None
    gpm: dict[str, float] = field(default_factory=dict)
    """GPM metric name (GPM_METRICS) -> percent over the interval; empty before Hopper."""
    processes: tuple[GpuProcess, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def classification(self) -> GpuClass:
        return classify_gpu(self.info)


def load_nvml() -> Any | None:
    """The pynvml module from nvidia-ml-py, or None where it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuProbe:
    """Samples every visible GPU; off, with a reason, where NVML or a GPU is missing.

    GPM metrics (:class:`GpmSampler`) cover the whole interval since the previous :meth:`sample`;
    on the first call, or after ``gpm_max_age_s``, a fresh pair ``gpm_interval_s`` apart is taken.
    """

    def __init__(
        self,
        nvml: Any | None,
        *,
        proc_root: Path = Path("/proc"),
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        gpm_interval_s: float = 0.5,
        gpm_max_age_s: float = 30.0,
    ) -> None:
        self.nvml: Any = nvml
        self._err: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._proc_root = proc_root
        self._clock = clock
        self._gpm = GpmSampler(
            nvml,
            self._err,
            monotonic=monotonic,
            sleep=sleep,
            interval_s=gpm_interval_s,
            max_age_s=gpm_max_age_s,
        )
        self._lock = threading.Lock()
        self._started = False
        self._initialised = False
        self.reason: str | None = None
        """Why the probe is off (None while it is on or not started)."""
        self.devices: list[Device] = []
        self.notes: list[str] = []
        """What works only partly (no GPM, Xid events not supported), said once."""
        self._xid = XidEvents(nvml, self._err, clock)

    @property
    def enabled(self) -> bool:
        return self._started and self.reason is None

    def start(self) -> str | None:
        """Initialise NVML once. Returns None when on, else the reason it is off."""
        with self._lock:
            if not self._started:
                self._started = True
                self.reason = self._init()
            return self.reason

    def _init(self) -> str | None:
        nvml = self.nvml
        if nvml is None:
            return "NVML not available: the nvidia-ml-py package (pynvml) is not installed"
        try:
            nvml.nvmlInit()
            self._initialised = True
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._err as e:
            return f"NVML not usable ({e}): no NVIDIA driver or GPU visible to this process"
        if not handles:
            return "no NVIDIA GPU visible to this process (NVML found 0 devices)"
        self.devices = [Device(i, h) for i, h in enumerate(handles)]
        for dev in self.devices:
            note = self._gpm.init(dev)
            if note is not None:
                self.notes.append(note)
        self.notes += self._xid.register(self.devices)
        return None

    def sample(self) -> GpuObs | None:
        """One observation of every GPU, or None while the probe is off."""
        readings = self.read()
        if readings is None:
            return None
        return GpuObs(t=self._clock(), gpus=tuple(r.info for r in readings))

    def read(self) -> tuple[GpuReading, ...] | None:
        """Like :meth:`sample`, with clocks, GPM metrics and process details."""
        if self.start() is not None:
            return None
        with self._lock:
            note = self._xid.drain()
            if note is not None:
                self.notes.append(note)
            gpm = self._gpm.read(self.devices)
            return tuple(self._read_device(dev, gpm.get(dev.index, {})) for dev in self.devices)

    def _read_device(self, dev: Device, gpm: dict[str, float]) -> GpuReading:
        errors: dict[str, str] = {}
        rates = self._get(errors, "utilization", "nvmlDeviceGetUtilizationRates", dev.handle)
        power = self._get(errors, "power", "nvmlDeviceGetPowerUsage", dev.handle)
        clock = self._get(errors, "sm_clock", "nvmlDeviceGetClockInfo", dev.handle, NVML_CLOCK_SM)
        procs = self._processes(dev, errors)
        info = GpuInfo(
            index=dev.index,
            util_pct=None if rates is None else float(rates.gpu),
            power_w=None if power is None else round(power / 1000.0, 1),
            sm_pct=gpm.get("sm_util"),
            tensor_pct=gpm.get("tensor_util"),
            dram_pct=gpm.get("dram_bw_util"),
            pids=tuple(p.pid if p.pid is not None else p.nvml_pid for p in procs),
        )
        mem_util = None if rates is None else float(rates.memory)
        return GpuReading(info, mem_util, clock, gpm, procs, errors)

    def _get(self, errors: dict[str, str], key: str, fn_name: str, *args: Any) -> Any:
        """One NVML call; a failure becomes ``errors[key]`` and None."""
        try:
            return getattr(self.nvml, fn_name)(*args)
        except self._err as e:
            errors[key] = str(e)
            return None

    def _processes(self, dev: Device, errors: dict[str, str]) -> tuple[GpuProcess, ...]:
        fn = "nvmlDeviceGetComputeRunningProcesses"
        raw = self._get(errors, "processes", fn, dev.handle) or []
        mapped = map_pids((int(p.pid) for p in raw), self._proc_root)
        out = []
        for p in raw:
            mem = getattr(p, "usedGpuMemory", None)
            pid, ns_pid = mapped[int(p.pid)]
            out.append(GpuProcess(int(p.pid), pid, ns_pid, int(mem) if mem is not None else None))
        return tuple(out)

    def xid_events(self) -> tuple[XidEvent, ...]:
        """Xid critical errors seen since :meth:`start` (the newest XID_KEEP)."""
        return self._xid.events()

    def close(self) -> None:
        """Free GPM samples and the event set and shut NVML down; the probe is off after."""
        with self._lock:
            bufs = [(self.nvml.nvmlGpmSampleFree, b) for d in self.devices for b in d.gpm]
            for fn, arg in bufs:
                with contextlib.suppress(self._err):  # shutting down: nothing to do about it
                    fn(arg)
            self._xid.close()
            if self._initialised:
                with contextlib.suppress(self._err):
                    self.nvml.nvmlShutdown()
            for dev in self.devices:
                dev.gpm = []
            self._initialised = False
            self.reason = self.reason or "closed"
            self._started = True
