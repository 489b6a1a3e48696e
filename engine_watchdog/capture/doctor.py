"""``doctor``: what this host can capture, and the fix for each missing piece.

Checks: ptrace allowed (yama ptrace_scope, CAP_SYS_PTRACE in CapEff, same UID as the engine),
py-spy present (and, with engine processes, a trial ``--nonblocking`` dump), NVML importable and
initialisable, cuda-gdb and eu-stack present, the engine's processes visible from here (PID
namespace shared), the incident dir can be created and written.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from engine_watchdog.capture.pyspy import FIX_MISSING, FIX_PERMISSION, classify_error
from engine_watchdog.capture.retention import cannot_write
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.engines import VLLM, EngineProfile
from engine_watchdog.host.tools import resolve_tools, run_bounded
from engine_watchdog.probes.pidns import read_status_field
from engine_watchdog.probes.procs import sample_procs
from engine_watchdog.probes.proctable import ProcTable

CAP_SYS_PTRACE = 19
CheckStatus = Literal["ok", "missing", "optional", "skipped"]

FIX_NAMESPACE = (
    "run the watchdog in the engine's PID namespace (Kubernetes: shareProcessNamespace: true in "
    "the pod spec; Docker: --pid=container:<engine>), or pass --pid"
)
FIX_NVML = (
    "no NVIDIA driver visible: run on a GPU node with the NVIDIA container toolkit "
    "(Kubernetes: NVIDIA_VISIBLE_DEVICES=all on the watchdog container) and "
    "pip install nvidia-ml-py"
)
FIX_INCIDENT_DIR = (
    "give --incident-dir (ENGINE_WATCHDOG_INCIDENT_DIR) a folder this user may create and write "
    "(Kubernetes: mount an emptyDir or a PersistentVolumeClaim there)"
)
FIX_CUDA_GDB = "install the CUDA toolkit's cuda-gdb (only to summarise CUDA core dumps)"
FIX_EU_STACK = "apt-get install elfutils (only for engines that are not Python: llama-server)"
FIX_OTHER_USER = (
    "run the watchdog as the engine's UID (Kubernetes: securityContext.runAsUser), or give it "
    "CAP_SYS_PTRACE (securityContext.capabilities.add: [SYS_PTRACE]); kernel.yama.ptrace_scope "
    "does not help across UIDs"
)
OTHER_USER = "other-user"
"""``Check.code`` of a ptrace check refused because the engine is another user's."""


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str
    fix: str = ""
    code: str = ""
    """Why it failed, where a caller acts on it (OTHER_USER: the CLI's exit code)."""


@dataclass(frozen=True)
class DoctorReport:
    checks: tuple[Check, ...]
    procs: tuple[ProcInfo, ...] = ()

    @property
    def ok(self) -> bool:
        """Every required check passed (optional and skipped ones do not count)."""
        return all(c.status != "missing" for c in self.checks)

    @property
    def other_user(self) -> bool:
        """The engine is another user's and we may not ptrace it."""
        return any(c.code == OTHER_USER for c in self.checks)


def has_cap(capeff_hex: str | None, cap: int) -> bool:
    return capeff_hex is not None and bool(int(capeff_hex, 16) >> cap & 1)


def ptrace_check(
    scope: int | None, cap_ptrace: bool, uid: int, engine_uids: Sequence[int]
) -> Check:
    """Can we ptrace the engine? ``scope`` None: no Yama (classic rules: same UID or the cap).

    The kernel's rule (ptrace_may_access): another UID needs CAP_SYS_PTRACE whatever Yama says;
    Yama only narrows what the same UID may do (1: descendants only, 2: the cap only)."""
    others = sorted({u for u in engine_uids if u != uid})
    where = f"yama ptrace_scope {scope if scope is not None else 'absent'}, uid {uid}"
    if scope == 3:
        return Check(
            "ptrace",
            "missing",
            f"{where}: ptrace disabled until reboot",
            "no fix on this node (until reboot): bundles keep what /proc shows, no stacks",
        )
    if cap_ptrace:
        return Check("ptrace", "ok", f"{where}, CAP_SYS_PTRACE held")
    if others:
        owner = ", ".join(map(str, others))
        return Check(
            "ptrace",
            "missing",
            f"cannot read another user's process (the engine runs as uid {owner}, this is uid "
            f"{uid}): run as that user or with CAP_SYS_PTRACE",
            FIX_OTHER_USER,
            OTHER_USER,
        )
    if scope in (None, 0):
        return Check("ptrace", "ok", f"{where}, same UID as the engine")
    reason = "scope 1 allows only descendants" if scope == 1 else "scope 2 needs CAP_SYS_PTRACE"
    return Check("ptrace", "missing", f"{where}, no CAP_SYS_PTRACE: {reason}", FIX_PERMISSION)


def _engine_uids(procs: Sequence[ProcInfo], proc_root: Path) -> list[int]:
    uids = []
    for p in procs:
        line = read_status_field(p.pid, "Uid", proc_root)
        if line:
            uids.append(int(line.split()[1]))  # effective UID, what ptrace compares
    return uids


def host_ptrace(procs: Sequence[ProcInfo], proc_root: Path) -> Check:
    try:
        text = (proc_root / "sys/kernel/yama/ptrace_scope").read_text().strip()
        scope: int | None = int(text)
    except (OSError, ValueError):
        scope = None
    cap = has_cap(read_status_field("self", "CapEff", proc_root), CAP_SYS_PTRACE)
    return ptrace_check(scope, cap, os.geteuid(), _engine_uids(procs, proc_root))


async def pyspy_checks(
    pyspy: str | None, procs: Sequence[ProcInfo], ptrace: Check | None = None
) -> list[Check]:
    if not pyspy:
        return [Check("py-spy", "missing", "py-spy not found on PATH", FIX_MISSING)]
    checks = [Check("py-spy", "ok", pyspy)]
    target = next((p for p in procs if p.state not in ("gone", "zombie")), None)
    if target is None:
        return checks
    if ptrace is not None and ptrace.code == OTHER_USER:
        # The kernel refuses it for certain: a trial would only add a second, vaguer line.
        checks.append(Check("py-spy trial", "skipped", "ptrace refused (see the ptrace line)"))
        return checks
    checks.append(await _pyspy_trial(pyspy, target))
    return checks


async def _pyspy_trial(pyspy: str, target: ProcInfo) -> Check:
    # Non-blocking: the trial must not pause the engine.
    argv = [pyspy, "dump", "--pid", str(target.pid), "--nonblocking"]
    try:
        res = await run_bounded(argv, 15.0)
    except OSError as e:  # py-spy (or the wrapper that ties it to us) cannot be started
        return Check("py-spy trial", "missing", f"cannot start {pyspy}: {e.strerror or e}")
    err = res.stderr.decode(errors="replace").strip().splitlines()
    if res.rc == 0:
        detail = f"dumped PID {target.pid} ({target.role}) in {res.elapsed_s:.2f} s"
        return Check("py-spy trial", "ok", detail)
    if res.timed_out:
        return Check("py-spy trial", "missing", f"PID {target.pid}: timed out", "")
    fix = FIX_PERMISSION if classify_error("\n".join(err)) == "permission-denied" else ""
    return Check("py-spy trial", "missing", f"PID {target.pid}: {err[0] if err else ''}", fix)


def nvml_check(load: Callable[[], Any] = lambda: importlib.import_module("pynvml")) -> Check:
    """NVML importable and initialisable; how many GPUs it sees. Blocking."""
    try:
        nvml = load()
    except ImportError as e:
        return Check("nvml", "optional", f"pynvml not importable: {e}", FIX_NVML)
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError and its many subclasses; absent driver is the common one
        return Check("nvml", "optional", f"NVML not available: {e}", FIX_NVML)
    try:
        count = int(nvml.nvmlDeviceGetCount())
        driver = nvml.nvmlSystemGetDriverVersion()
        return Check("nvml", "ok", f"{count} GPU(s), driver {driver}")
    except Exception as e:
        return Check("nvml", "optional", f"NVML initialised but failed: {e}", FIX_NVML)
    finally:
        nvml.nvmlShutdown()


def procs_check(url: str | None, pids: Sequence[int], procs: Sequence[ProcInfo]) -> Check:
    if not url and not pids:
        return Check("engine processes", "skipped", "no --url or --pid given")
    live = [p for p in procs if p.state != "gone"]
    roles = ", ".join(f"{p.role} {p.pid}" for p in live)
    if not live:
        return Check(
            "engine processes", "missing", f"none visible for {url or list(pids)}", FIX_NAMESPACE
        )
    if not any(p.role in ("engine-core", "worker") for p in live):
        return Check(
            "engine processes", "missing", f"found {roles} but no engine core", FIX_NAMESPACE
        )
    return Check("engine processes", "ok", roles)


def incident_dir_check(incident_dir: Path) -> Check:
    """The incident dir can be created and written (a probe file; what it had to create is
    removed again: the doctor leaves nothing behind). Blocking."""
    why = cannot_write(incident_dir, keep=False)
    if why is None:
        return Check("incident dir", "ok", f"{incident_dir} can be written")
    return Check(
        "incident dir",
        "missing",
        f"cannot create or write {incident_dir} ({why}): bundles would go to a temporary folder",
        FIX_INCIDENT_DIR,
    )


async def run_doctor(
    url: str | None = None,
    pids: Sequence[int] = (),
    *,
    profile: EngineProfile = VLLM,
    tools: dict[str, str] | None = None,
    proc_root: Path = Path("/proc"),
    table: ProcTable | None = None,
    nvml_load: Callable[[], Any] | None = None,
    incident_dir: Path | None = None,
) -> DoctorReport:
    """Run every check; blocking parts run in threads."""
    tools = resolve_tools() if tools is None else tools
    procs: tuple[ProcInfo, ...] = ()
    if url or pids:
        obs = await asyncio.to_thread(
            sample_procs, url, pids, profile=profile, table=table, proc_root=proc_root
        )
        procs = obs.procs
    nvml = await asyncio.to_thread(nvml_check, *([nvml_load] if nvml_load else []))
    gdb, eu_stack = tools.get("cuda-gdb"), tools.get("eu-stack")
    ptrace = host_ptrace(procs, proc_root)
    checks = [
        ptrace,
        *await pyspy_checks(tools.get("py-spy"), procs, ptrace),
        nvml,
        Check("cuda-gdb", "ok", gdb)
        if gdb
        else Check("cuda-gdb", "optional", "not found", FIX_CUDA_GDB),
        Check("eu-stack", "ok", eu_stack)
        if eu_stack
        else Check("eu-stack", "optional", "not found", FIX_EU_STACK),
        procs_check(url, pids, procs),
    ]
    if incident_dir is not None:
        checks.append(await asyncio.to_thread(incident_dir_check, incident_dir))
    return DoctorReport(tuple(checks), procs)


def render_text(report: DoctorReport) -> str:
    marks = {"ok": "ok", "missing": "MISSING", "optional": "optional", "skipped": "skipped"}
    lines = []
    for c in report.checks:
        lines.append(f"{marks[c.status]:<9}{c.name:<18}{c.detail}")
        if c.fix and c.status != "ok":
            lines.append(f"{'':<27}fix: {c.fix}")
    if report.other_user:
        lines.append(
            "capture NOT ready: cannot read another user's process: run as that user or with "
            "CAP_SYS_PTRACE"
        )
    else:
        lines.append("capture ready" if report.ok else "capture NOT ready: see MISSING above")
    return "\n".join(lines) + "\n"


def render_json(report: DoctorReport) -> str:
    return json.dumps(
        {
            "ok": report.ok,
            "checks": [asdict(c) for c in report.checks],
            "processes": [asdict(p) for p in report.procs],
        },
        indent=2,
    )
