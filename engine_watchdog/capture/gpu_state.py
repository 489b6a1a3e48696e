"""Capture step ``gpu``: a snapshot of every GPU into ``gpu.json`` and a short ``gpu.txt``.

Per GPU: utilization, power, clocks and the clock-event reasons by name, memory, ECC error counts,
NVLink error counters where links are up, the Xid events seen since the probe started, the compute
processes (with the PID mapping between namespaces), GPM activity and the classification. It
shares the watch loop's :class:`GpuProbe` so the Xid history and the GPM interval carry over.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.host.tools import write_private
from engine_watchdog.probes.nvml import GpuProbe, GpuReading
from engine_watchdog.probes.xid import XidEvent

NAME = "gpu"

# nvmlClocksEventReason* bits (nvml.h), named as nvidia-smi names them.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NVLINK_ERRORS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}
NVLINK_MAX_LINKS = 18  # NVLink 4 (Hopper) has 18 links; the loop stops at the first absent one
CLOCKS = {"graphics": 0, "sm": 1, "memory": 2}


def decode_clock_reasons(mask: int) -> list[str]:
    """Names of the bits set in an nvmlDeviceGetCurrentClocksEventReasons mask."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([f"unknown_0x{unknown:x}"] if unknown else [])


class _Reader:
    """Calls one NVML function per field; a failure becomes an entry in ``errors``."""

    def __init__(self, probe: GpuProbe, handle: Any) -> None:
        self.nvml, self.handle = probe.nvml, handle
        self.err: type[BaseException] = getattr(probe.nvml, "NVMLError", Exception)
        self.errors: dict[str, str] = {}

    def get(self, key: str, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            self.errors[key] = f"{fn_name} not in this nvidia-ml-py"
            return None
        try:
            return fn(self.handle, *args)
        except self.err as e:
            self.errors[key] = str(e)
            return None


def device_details(probe: GpuProbe, handle: Any) -> dict[str, Any]:
    """What NVML says of one GPU beyond the probe's sample (identity, clocks, memory, errors)."""
    r = _Reader(probe, handle)
    name, uuid, pci = r.get("name", "nvmlDeviceGetName"), r.get("uuid", "nvmlDeviceGetUUID"), None
    pci_info = r.get("pci", "nvmlDeviceGetPciInfo")
    if pci_info is not None:
        pci = _text(getattr(pci_info, "busId", None))
    mem = r.get("memory", "nvmlDeviceGetMemoryInfo")
    reasons = r.get("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:  # nvidia-ml-py before 12.535 names it "throttle reasons"
        reasons = r.get("clock_event_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    limit = r.get("power_limit", "nvmlDeviceGetEnforcedPowerLimit")
    details = {
        "name": _text(name),
        "uuid": _text(uuid),
        "pci_bus_id": pci,
        "temperature_c": r.get("temperature", "nvmlDeviceGetTemperature", 0),
        "power_limit_w": None if limit is None else round(limit / 1000.0, 1),
        "clocks_mhz": {
            k: r.get(f"clock_{k}", "nvmlDeviceGetClockInfo", v) for k, v in CLOCKS.items()
        },
        "max_sm_clock_mhz": r.get("max_sm_clock", "nvmlDeviceGetMaxClockInfo", CLOCKS["sm"]),
        "clock_event_reasons": None if reasons is None else decode_clock_reasons(int(reasons)),
        "clock_event_reasons_mask": reasons,
        "memory_bytes": None
        if mem is None
        else {"total": mem.total, "used": mem.used, "free": mem.free},
        "ecc_errors": _ecc(r),
        "nvlink_errors": _nvlink(r),
    }
    details["errors"] = r.errors
    return details


def _ecc(r: _Reader) -> dict[str, dict[str, int | None]] | None:
    out = {
        counter: {
            kind: r.get(f"ecc_{counter}_{kind}", "nvmlDeviceGetTotalEccErrors", etype, ctype)
            for kind, etype in (("corrected", 0), ("uncorrected", 1))
        }
        for counter, ctype in (("volatile", 0), ("aggregate", 1))
    }
    if all(v is None for c in out.values() for v in c.values()):
        return None  # ECC off or not supported: the errors entries say which
    return out


def _nvlink(r: _Reader) -> dict[str, dict[str, int | None]] | None:
    links: dict[str, dict[str, int | None]] = {}
    for link in range(NVLINK_MAX_LINKS):
        state = r.get(f"nvlink_{link}", "nvmlDeviceGetNvLinkState", link)
        if state is None:
            if link > 0:
                r.errors.pop(f"nvlink_{link}", None)  # past the last link: not an error
            break
        if state:
            links[str(link)] = {
                k: r.get(f"nvlink_{link}_{k}", "nvmlDeviceGetNvLinkErrorCounter", link, c)
                for k, c in NVLINK_ERRORS.items()
            }
    return links or None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return None if value is None else str(value)


def snapshot(probe: GpuProbe, procs: tuple[ProcInfo, ...] = ()) -> dict[str, Any]:
    """The whole GPU picture as JSON-ready data (blocking: NVML calls)."""
    readings = probe.read()
    if readings is None:
        return {"available": False, "reason": probe.reason}
    roles = {p.pid: p.role for p in procs}
    xids = probe.xid_events()
    handles = {dev.index: dev.handle for dev in probe.devices}
    gpus = [
        _gpu_entry(r, device_details(probe, handles[r.info.index]), xids, roles) for r in readings
    ]
    return {
        "available": True,
        "t": time.time(),
        "driver_version": _text(_quiet_call(probe, "nvmlSystemGetDriverVersion")),
        "nvml_version": _text(_quiet_call(probe, "nvmlSystemGetNVMLVersion")),
        "notes": list(probe.notes),
        "xid_events_since_start": [_xid(e) for e in xids],
        "gpus": gpus,
    }


def _gpu_entry(
    r: GpuReading, details: dict[str, Any], xids: tuple[XidEvent, ...], roles: dict[int, str]
) -> dict[str, Any]:
    info = r.info
    return {
        "index": info.index,
        **{k: v for k, v in details.items() if k != "errors"},
        "classification": r.classification,
        "utilization_pct": {"gpu": info.util_pct, "memory": r.mem_util_pct},
        "power_w": info.power_w,
        "sm_clock_mhz": r.sm_clock_mhz,
        "gpm_pct": r.gpm or None,
        "processes": [
            {
                "nvml_pid": p.nvml_pid,
                "pid": p.pid,
                "ns_pid": p.ns_pid,
                "engine_role": roles.get(p.pid) if p.pid is not None else None,
                "used_memory_bytes": p.used_memory_bytes,
            }
            for p in r.processes
        ],
        "xid_events": [_xid(e) for e in xids if e.gpu == info.index],
        "errors": {**r.errors, **details["errors"]},
    }


def _xid(e: XidEvent) -> dict[str, Any]:
    return {"t": e.t, "gpu": e.gpu, "xid": e.xid}


def _quiet_call(probe: GpuProbe, fn_name: str) -> Any:
    try:
        return getattr(probe.nvml, fn_name)()
    except Exception:  # optional identity fields: never fail the snapshot for them
        return None


def render_text(snap: dict[str, Any]) -> str:
    """A few lines per GPU for a human (and for summary.md)."""
    if not snap.get("available"):
        return f"GPU: not available: {snap.get('reason')}\n"
    lines = [
        f"driver {snap.get('driver_version')}; Xid events since start: "
        f"{len(snap['xid_events_since_start'])}"
    ]
    for g in snap["gpus"]:
        gpm = g["gpm_pct"] or {}
        mem = g["memory_bytes"] or {}
        pids = ", ".join(
            f"{p['pid'] or p['nvml_pid']}"
            + (f" (ns {p['ns_pid']})" if p["ns_pid"] != p["pid"] else "")
            for p in g["processes"]
        )
        lines += [
            f"GPU {g['index']} {g['name']}: {g['classification'].upper()}",
            f"  util {g['utilization_pct']['gpu']} %, power {g['power_w']} W, "
            f"SM clock {g['sm_clock_mhz']} MHz, clock events: "
            f"{', '.join(g['clock_event_reasons'] or []) or 'none'}",
            "  GPM: " + (", ".join(f"{k} {v} %" for k, v in gpm.items()) or "not available"),
            f"  memory used {_gib(mem.get('used'))} / {_gib(mem.get('total'))} GiB; "
            f"uncorrected ECC (volatile): {_ecc_uncorrected(g['ecc_errors'])}; "
            f"NVLink: {_nvlink_text(g['nvlink_errors'])}",
            f"  processes: {pids or 'none'}; Xid: {[e['xid'] for e in g['xid_events']] or 'none'}",
        ]
    return "\n".join(lines) + "\n"


def _ecc_uncorrected(ecc: dict[str, dict[str, int | None]] | None) -> str:
    return "n/a" if ecc is None else str(ecc["volatile"]["uncorrected"])


def _nvlink_text(links: dict[str, dict[str, int | None]] | None) -> str:
    if not links:
        return "no links up"
    errors = sum(v or 0 for counters in links.values() for v in counters.values())
    return f"{len(links)} links up, {errors} error counts (replay/recovery/CRC)"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f}"


def make_gpu_step(probe: GpuProbe) -> CaptureStep:
    """The capture step over a (shared, long-lived) probe."""

    async def gpu_step(ctx: CaptureContext) -> StepResult:
        t0 = time.monotonic()
        try:
            snap = await asyncio.wait_for(
                asyncio.to_thread(snapshot, probe, ctx.procs), ctx.timeout_s
            )
        except asyncio.TimeoutError:
            # The NVML thread cannot be cancelled; it finishes on its own and is dropped.
            detail = f"NVML did not answer within {ctx.timeout_s:.0f} s"
            return StepResult(NAME, "timeout", detail=detail, elapsed_s=time.monotonic() - t0)
        if not snap["available"]:
            return StepResult(
                NAME, "not-available", detail=str(snap["reason"]), elapsed_s=time.monotonic() - t0
            )
        write_private(ctx.workdir / "gpu.json", json.dumps(snap, indent=1, default=str).encode())
        write_private(ctx.workdir / "gpu.txt", render_text(snap).encode())
        classes = ", ".join(f"GPU {g['index']} {g['classification']}" for g in snap["gpus"])
        return StepResult(NAME, "ok", ("gpu.json", "gpu.txt"), classes, time.monotonic() - t0)

    return gpu_step
