"""GPU probe: NVML (and GPM on Hopper and later) per GPU, the processes on it, and Xid events.

The NVML module is passed in (``pynvml`` from nvidia-ml-py on a real host, a small fake in unit
tests) and so is ``/proc``: the same code runs on a GPU machine and in CI. Every call blocks:
the watch loop runs :meth:`GpuProbe.sample` through ``asyncio.to_thread``.

:func:`classify_gpu` is pure and tells a GPU that computes from one that spins without doing
anything (a kernel waiting for a peer) and from one that is idle (the host side is stuck).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine_watchdog.model import GpuInfo, GpuObs

GpuClass = Literal["computing", "spinning", "idle", "unknown"]

# Thresholds from FACTS.md, GPU section (seen on an H200, driver 580): a kernel spin-waiting for a
# peer showed NVML utilization 100 % with GPM tensor 0.0 % and DRAM bandwidth 0.0 % (SM util 100 %
# for a spin kernel, only 18 % for a stuck NCCL all-reduce, so SM util is not a criterion); a
# host-side deadlock shows utilization 0 %; real decoding shows tensor activity or DRAM traffic.
BUSY_UTIL_MIN_PCT = 90.0
"""NVML utilization at or above this, with no tensor and no DRAM activity: spinning."""
IDLE_UTIL_MAX_PCT = 1.0
"""NVML utilization at or below this (FACTS saw exactly 0; 1 tolerates a stray kernel): idle."""
TENSOR_ACTIVE_MIN_PCT = 1.0
"""GPM tensor activity above this is real work (the spin showed 0.0)."""
DRAM_ACTIVE_MIN_PCT = 1.0
"""GPM DRAM bandwidth above this is real work (the spin showed 0.0; decode is memory-bound)."""

# NVML ids (nvml.h); numbers rather than module attributes so older nvidia-ml-py releases and
# the test fake need not define every name.
GPM_METRICS: dict[str, int] = {
    "graphics_util": 1,
    "sm_util": 2,
    "sm_occupancy": 3,
    "tensor_util": 5,
    "dram_bw_util": 10,
}
NVML_CLOCK_SM = 1
NVML_ERROR_TIMEOUT = 10
XID_CRITICAL_ERROR_EVENT = 0x8
GPM_MIN_INTERVAL_S = 0.1
"""GPM samples closer than this give noise; the first sample of a pair is then taken again."""
XID_KEEP = 256
XID_DRAIN_MAX = 64


def classify_gpu(info: GpuInfo) -> GpuClass:
    """Computing, spinning, idle or unknown, from one GPU's sample (thresholds above)."""
    if _above(info.tensor_pct, TENSOR_ACTIVE_MIN_PCT) or _above(info.dram_pct, DRAM_ACTIVE_MIN_PCT):
        return "computing"
    if info.util_pct is None:
        return "unknown"
    if info.util_pct <= IDLE_UTIL_MAX_PCT:
        return "idle"
    # Without GPM (before Hopper) a busy GPU cannot be told apart from a spinning one.
    if (
        info.util_pct >= BUSY_UTIL_MIN_PCT
        and info.tensor_pct is not None
        and info.dram_pct is not None
    ):
        return "spinning"
    return "unknown"


def _above(value: float | None, threshold: float) -> bool:
    return value is not None and value > threshold


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


@dataclass(frozen=True)
class XidEvent:
    t: float
    gpu: int | None
    xid: int


@dataclass
class _Device:
    index: int
    handle: Any
    gpm: list[Any] = field(default_factory=list)
    """Two GPM sample buffers ([previous, spare]) when GPM is supported."""
    gpm_t: float | None = None
    """When buffer 0 was filled (monotonic)."""


def load_nvml() -> Any | None:
    """The pynvml module from nvidia-ml-py, or None where it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuProbe:
    """Samples every visible GPU; off, with a reason, where NVML or a GPU is missing.

    GPM metrics come from two GPM samples: the one taken at the previous :meth:`sample` and a new
    one, so each covers the whole interval between samples; on the first call, or when the last
    sample is older than ``gpm_max_age_s``, a fresh pair ``gpm_interval_s`` apart is taken.
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
        self._clock, self._monotonic, self._sleep = clock, monotonic, sleep
        self._gpm_interval_s, self._gpm_max_age_s = gpm_interval_s, gpm_max_age_s
        self._lock = threading.Lock()
        self._started = False
        self._initialised = False
        self.reason: str | None = None
        """Why the probe is off (None while it is on or not started)."""
        self.devices: list[_Device] = []
        self.notes: list[str] = []
        """What works only partly (no GPM, Xid events not supported), said once."""
        self._events: Any | None = None
        self._xids: deque[XidEvent] = deque(maxlen=XID_KEEP)

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
        self.devices = [_Device(i, h) for i, h in enumerate(handles)]
        for dev in self.devices:
            self._init_gpm(dev)
        self._register_xid()
        return None

    def _init_gpm(self, dev: _Device) -> None:
        try:
            if not self.nvml.nvmlGpmQueryDeviceSupport(dev.handle).isSupportedDevice:
                self.notes.append(
                    f"GPU {dev.index}: no GPM (before Hopper): no tensor/DRAM activity"
                )
                return
            dev.gpm = [self.nvml.nvmlGpmSampleAlloc(), self.nvml.nvmlGpmSampleAlloc()]
        except (self._err, AttributeError) as e:
            self.notes.append(f"GPU {dev.index}: GPM not usable: {e}")

    def _register_xid(self) -> None:
        try:
            self._events = self.nvml.nvmlEventSetCreate()
        except (self._err, AttributeError) as e:
            self.notes.append(f"Xid events not available: {e}")
            return
        for dev in self.devices:
            try:
                self.nvml.nvmlDeviceRegisterEvents(
                    dev.handle, XID_CRITICAL_ERROR_EVENT, self._events
                )
            except self._err as e:
                self.notes.append(f"GPU {dev.index}: Xid events not available: {e}")

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
            self._drain_xid()
            gpm = self._read_gpm()
            return tuple(self._read_device(dev, gpm.get(dev.index, {})) for dev in self.devices)

    def _read_device(self, dev: _Device, gpm: dict[str, float]) -> GpuReading:
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

    def _processes(self, dev: _Device, errors: dict[str, str]) -> tuple[GpuProcess, ...]:
        fn = "nvmlDeviceGetComputeRunningProcesses"
        raw = self._get(errors, "processes", fn, dev.handle) or []
        mapped = map_pids((int(p.pid) for p in raw), self._proc_root)
        out = []
        for p in raw:
            mem = getattr(p, "usedGpuMemory", None)
            pid, ns_pid = mapped[int(p.pid)]
            out.append(GpuProcess(int(p.pid), pid, ns_pid, int(mem) if mem is not None else None))
        return tuple(out)

    def _read_gpm(self) -> dict[int, dict[str, float]]:
        devs = [d for d in self.devices if d.gpm]
        now = self._monotonic()
        stale = [d for d in devs if d.gpm_t is None or now - d.gpm_t > self._gpm_max_age_s]
        for dev in stale:
            self._gpm_take(dev, 0)
        wait = self._gpm_interval_s if stale else 0.0
        recent = max((d.gpm_t for d in devs if d.gpm_t is not None), default=None)
        if recent is not None:
            wait = max(wait, GPM_MIN_INTERVAL_S - (self._monotonic() - recent))
        if wait > 0:
            self._sleep(wait)
        out = {}
        for dev in devs:
            if dev.gpm_t is None or not self._gpm_take(dev, 1):
                continue
            out[dev.index] = self._gpm_metrics(dev)
            dev.gpm.reverse()  # the new sample becomes the first of the next pair
        return out

    def _gpm_take(self, dev: _Device, slot: int) -> bool:
        try:
            self.nvml.nvmlGpmSampleGet(dev.handle, dev.gpm[slot])
        except self._err:
            dev.gpm_t = None
            return False
        dev.gpm_t = self._monotonic()
        return True

    def _gpm_metrics(self, dev: _Device) -> dict[str, float]:
        req = self.nvml.c_nvmlGpmMetricsGet_t()
        req.version = getattr(self.nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        req.numMetrics = len(GPM_METRICS)
        req.sample1, req.sample2 = dev.gpm[0], dev.gpm[1]
        for i, metric_id in enumerate(GPM_METRICS.values()):
            req.metrics[i].metricId = metric_id
        try:
            self.nvml.nvmlGpmMetricsGet(req)
        except self._err:
            return {}
        return {
            name: round(float(req.metrics[i].value), 2)
            for i, name in enumerate(GPM_METRICS)
            if int(req.metrics[i].nvmlReturn) == 0
        }

    def _drain_xid(self) -> None:
        """Collect the Xid events queued since the last sample, without waiting (0 ms)."""
        if self._events is None:
            return
        wait = getattr(self.nvml, "nvmlEventSetWait_v2", None) or self.nvml.nvmlEventSetWait
        for _ in range(XID_DRAIN_MAX):
            try:
                data = wait(self._events, 0)
            except self._err as e:
                if getattr(e, "value", None) != NVML_ERROR_TIMEOUT:
                    self.notes.append(f"Xid event wait failed: {e}")
                    self._events = None
                return
            self._xids.append(
                XidEvent(self._clock(), self._index_of(data.device), int(data.eventData))
            )

    def _index_of(self, handle: Any) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetIndex(handle))
        except (self._err, AttributeError):
            return None

    def xid_events(self) -> tuple[XidEvent, ...]:
        """Xid critical errors seen since :meth:`start` (the newest XID_KEEP)."""
        return tuple(self._xids)

    def close(self) -> None:
        """Free GPM samples and the event set and shut NVML down; the probe is off after."""
        with self._lock:
            bufs = [(self.nvml.nvmlGpmSampleFree, b) for d in self.devices for b in d.gpm]
            if self._events is not None:
                bufs.append((self.nvml.nvmlEventSetFree, self._events))
            for fn, arg in bufs:
                with contextlib.suppress(self._err):  # shutting down: nothing to do about it
                    fn(arg)
            if self._initialised:
                with contextlib.suppress(self._err):
                    self.nvml.nvmlShutdown()
            for dev in self.devices:
                dev.gpm = []
            self._events, self._initialised = None, False
            self.reason = self.reason or "closed"
            self._started = True


def read_nspid(proc_root: Path, pid: int) -> tuple[int, ...] | None:
    """The ``NSpid`` line of /proc/PID/status (outermost namespace first), or None."""
    try:
        text = (proc_root / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return tuple(int(x) for x in line.split()[1:])
    return (pid,)  # kernels before 4.1 have no NSpid line: no nested namespace to show


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
