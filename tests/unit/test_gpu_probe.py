"""GpuProbe and classify_gpu against a fake NVML module (no GPU here; the same code runs on one)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine_watchdog.capture.gpu_state import decode_clock_reasons, make_gpu_step, render_text
from engine_watchdog.capture.step import CaptureContext
from engine_watchdog.core.gpu_class import classify_gpu
from engine_watchdog.core.model import GpuInfo, ProcInfo
from engine_watchdog.probes.nvml import GpuProbe
from engine_watchdog.probes.pidns import map_pids


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeMetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, value=0.0, nvmlReturn=0) for _ in range(10)]


class FakeNVML:
    """The few nvml* functions the probe and the capture step use, over per-GPU dicts."""

    NVMLError = FakeNVMLError
    c_nvmlGpmMetricsGet_t = FakeMetricsGet

    def __init__(self, gpus: list[dict[str, Any]], *, xids: list[tuple[int, int]] = ()) -> None:  # type: ignore[assignment]
        self.gpus = gpus
        self.pending_xids = list(xids)
        self.calls: list[str] = []
        self.shutdown = False

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.gpus[i]

    def nvmlDeviceGetIndex(self, h: dict[str, Any]) -> int:
        return self.gpus.index(h)

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> Any:
        return SimpleNamespace(gpu=h["util"], memory=h.get("mem_util", 0))

    def nvmlDeviceGetPowerUsage(self, h: dict[str, Any]) -> int:
        return int(h["power_w"] * 1000)

    def nvmlDeviceGetClockInfo(self, h: dict[str, Any], kind: int) -> int:
        return int(h.get("clock", 1980))

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=512 << 20) for p in h.get("pids", [])]

    def nvmlGpmQueryDeviceSupport(self, h: dict[str, Any]) -> Any:
        return SimpleNamespace(isSupportedDevice=int("gpm" in h))

    def nvmlGpmSampleAlloc(self) -> Any:
        return SimpleNamespace(taken_from=None)

    def nvmlGpmSampleFree(self, s: Any) -> None:
        pass

    def nvmlGpmSampleGet(self, h: dict[str, Any], s: Any) -> None:
        self.calls.append("gpm-sample")
        s.taken_from = h

    def nvmlGpmMetricsGet(self, req: FakeMetricsGet) -> None:
        gpm = req.sample1.taken_from["gpm"]
        for i in range(req.numMetrics):
            m = req.metrics[i]
            if m.metricId in gpm:
                m.value = gpm[m.metricId]
            else:
                m.nvmlReturn = 3

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: dict[str, Any], mask: int, es: str) -> None:
        if h.get("no_events"):
            raise FakeNVMLError(3)

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0
        if not self.pending_xids:
            raise FakeNVMLError(10)
        gpu, xid = self.pending_xids.pop(0)
        return SimpleNamespace(device=self.gpus[gpu], eventType=8, eventData=xid)

    def nvmlEventSetFree(self, es: str) -> None:
        pass

    # capture-step extras
    def nvmlDeviceGetName(self, h: dict[str, Any]) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: dict[str, Any]) -> int:
        return int(h.get("reasons", 0))

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> Any:
        return SimpleNamespace(total=143 << 30, used=2 << 30, free=141 << 30)

    def nvmlDeviceGetTotalEccErrors(self, h: dict[str, Any], etype: int, ctype: int) -> int:
        return 0

    def nvmlDeviceGetNvLinkState(self, h: dict[str, Any], link: int) -> int:
        if link >= h.get("links", 0):
            raise FakeNVMLError(2)
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: dict[str, Any], link: int, counter: int) -> int:
        return counter

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"


# The H200 numbers of docs/gpu-verification.md: a spin kernel, an idle peer, and decoding.
SPIN = {"util": 100, "power_w": 137.0, "gpm": {2: 100.0, 3: 6.0, 5: 0.0, 10: 0.0}}
IDLE = {"util": 0, "power_w": 118.0, "gpm": {2: 0.0, 3: 0.0, 5: 0.0, 10: 0.0}}
DECODE = {"util": 97, "power_w": 450.0, "gpm": {2: 80.0, 3: 30.0, 5: 35.0, 10: 60.0}}


def fake_proc(root: Path, pid: int, nspid: tuple[int, ...]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\tpython\nNSpid:\t{' '.join(map(str, nspid))}\n")


def make_probe(nvml: Any, proc_root: Path, sleeps: list[float] | None = None) -> GpuProbe:
    clock = iter(range(1000, 10**6))
    return GpuProbe(
        nvml,
        proc_root=proc_root,
        clock=lambda: float(next(clock)),
        monotonic=lambda: 0.0 if sleeps is None else sum(sleeps),
        sleep=(sleeps.append if sleeps is not None else lambda s: None),
    )


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (GpuInfo(0, 100.0, 137.0, sm_pct=100.0, tensor_pct=0.0, dram_pct=0.0), "spinning"),
        (GpuInfo(0, 100.0, 124.0, sm_pct=18.0, tensor_pct=0.0, dram_pct=0.0), "spinning"),
        (GpuInfo(1, 0.0, 118.0, sm_pct=0.0, tensor_pct=0.0, dram_pct=0.0), "idle"),
        (GpuInfo(0, 97.0, 450.0, sm_pct=80.0, tensor_pct=35.0, dram_pct=60.0), "computing"),
        (GpuInfo(0, 100.0, 300.0, tensor_pct=0.0, dram_pct=42.0), "computing"),
        (GpuInfo(0, 100.0, 300.0), "unknown"),  # no GPM: busy cannot be told from spinning
        (GpuInfo(0, 0.0, 60.0), "idle"),
        (GpuInfo(0, 50.0, 200.0, tensor_pct=0.0, dram_pct=0.0), "unknown"),
        (GpuInfo(0, None, None), "unknown"),
    ],
)
def test_classify_gpu(info: GpuInfo, expected: str) -> None:
    assert classify_gpu(info) == expected


def test_off_without_nvml_says_why_once(tmp_path: Path) -> None:
    probe = GpuProbe(None, proc_root=tmp_path)
    reason = probe.start()
    assert reason is not None and "nvidia-ml-py" in reason
    assert probe.start() == reason and not probe.enabled
    assert probe.sample() is None


def test_off_when_init_fails_or_no_gpu(tmp_path: Path) -> None:
    class Broken(FakeNVML):
        def nvmlInit(self) -> None:
            raise FakeNVMLError(9)

    assert "no NVIDIA driver" in (GpuProbe(Broken([]), proc_root=tmp_path).start() or "")
    assert "0 devices" in (GpuProbe(FakeNVML([]), proc_root=tmp_path).start() or "")


def test_sample_spin_and_idle_with_gpm_pairs(tmp_path: Path) -> None:
    fake_proc(tmp_path, 441, (441, 17))
    sleeps: list[float] = []
    nvml = FakeNVML([{**SPIN, "pids": [441]}, IDLE])
    probe = make_probe(nvml, tmp_path, sleeps)
    assert probe.start() is None
    obs = probe.sample()
    assert obs is not None and obs.t == 1000.0
    spin, idle = obs.gpus
    assert (spin.util_pct, spin.power_w, spin.sm_pct, spin.tensor_pct, spin.dram_pct) == (
        100.0,
        137.0,
        100.0,
        0.0,
        0.0,
    )
    assert spin.pids == (441,) and classify_gpu(spin) == "spinning"
    assert classify_gpu(idle) == "idle"
    assert sleeps == [0.5]  # a fresh pair on the first sample, one sleep for all GPUs
    probe.sample()
    assert sleeps == [0.5, 0.1]  # the next pair reuses the last sample; only the minimum gap
    readings = probe.read()
    assert readings is not None
    proc = readings[0].processes[0]
    assert (proc.nvml_pid, proc.pid, proc.ns_pid, proc.used_memory_bytes) == (
        441,
        441,
        17,
        512 << 20,
    )
    assert readings[0].gpm["sm_occupancy"] == 6.0 and readings[0].sm_clock_mhz == 1980


def test_no_gpm_before_hopper(tmp_path: Path) -> None:
    nvml = FakeNVML([{"util": 100, "power_w": 250.0}])
    probe = make_probe(nvml, tmp_path, [])
    obs = probe.sample()
    assert obs is not None and obs.gpus[0].tensor_pct is None
    assert "gpm-sample" not in nvml.calls and any("GPM" in n for n in probe.notes)


def test_xid_events_drained_at_each_sample(tmp_path: Path) -> None:
    nvml = FakeNVML([SPIN, {**IDLE, "no_events": True}], xids=[(0, 79)])
    probe = make_probe(nvml, tmp_path)
    probe.sample()
    nvml.pending_xids.append((0, 13))
    probe.sample()
    assert [(e.gpu, e.xid) for e in probe.xid_events()] == [(0, 79), (0, 13)]
    assert any("GPU 1: Xid events not available" in n for n in probe.notes)
    probe.close()
    assert nvml.shutdown and probe.sample() is None and probe.reason == "closed"


def test_map_pids_between_namespaces(tmp_path: Path) -> None:
    fake_proc(tmp_path, 5000, (5000, 12))  # visible, in a container where it is PID 12
    fake_proc(tmp_path, 6000, (6000, 7))  # NVML reported the inner PID 7
    got = map_pids([5000, 7, 99999], tmp_path)
    assert got == {5000: (5000, 12), 7: (6000, 7), 99999: (None, None)}


def test_clock_reason_names() -> None:
    assert decode_clock_reasons(0) == []
    assert decode_clock_reasons(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert decode_clock_reasons(0x1000) == ["unknown_0x1000"]


async def test_gpu_capture_step_writes_snapshot(tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    fake_proc(proc_root, 441, (441, 17))
    nvml = FakeNVML([{**SPIN, "pids": [441], "links": 2, "reasons": 0}, IDLE], xids=[(1, 79)])
    probe = make_probe(nvml, proc_root)
    probe.start()
    work = tmp_path / "bundle"
    work.mkdir()
    procs = (ProcInfo(441, 1, "engine-core", "VLLM::EngineCore", "running", 1.0),)
    res = await make_gpu_step(probe)(CaptureContext(workdir=work, procs=procs))
    assert res.status == "ok" and res.files == ("gpu.json", "gpu.txt")
    assert res.detail == "GPU 0 spinning, GPU 1 idle"
    snap = json.loads((work / "gpu.json").read_text())
    g0, g1 = snap["gpus"]
    assert g0["name"] == "NVIDIA H200" and g0["classification"] == "spinning"
    assert g0["processes"][0] == {
        "nvml_pid": 441,
        "pid": 441,
        "ns_pid": 17,
        "engine_role": "engine-core",
        "used_memory_bytes": 512 << 20,
    }
    assert g0["nvlink_errors"] == {
        "0": {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3},
        "1": {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3},
    }
    assert g0["ecc_errors"]["volatile"] == {"corrected": 0, "uncorrected": 0}
    assert g0["clock_event_reasons"] == [] and g0["gpm_pct"]["tensor_util"] == 0.0
    assert g1["xid_events"][0]["xid"] == 79 and g1["nvlink_errors"] is None
    assert "nvlink_0" in g1["errors"]
    text = (work / "gpu.txt").read_text()
    assert "GPU 0 NVIDIA H200: SPINNING" in text and "441 (ns 17)" in text
    assert "NVLink: 2 links up, 12 error counts" in text and "NVLink: no links up" in text


async def test_gpu_capture_step_not_available(tmp_path: Path) -> None:
    probe = GpuProbe(None, proc_root=tmp_path)
    res = await make_gpu_step(probe)(CaptureContext(workdir=tmp_path, procs=()))
    assert res.status == "not-available" and "nvidia-ml-py" in res.detail and not res.files
    assert "not available" in render_text({"available": False, "reason": "x"})
