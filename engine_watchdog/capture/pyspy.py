"""Capture step: Python and native stacks of every engine process, with py-spy, in parallel.

Per process (py-spy 0.4.3; py-spy #872): ``dump --native`` first under a short timeout (a PyTorch
process with ~160 threads can take many seconds native), then a plain dump; a stopped process
(state T) gets ``--nonblocking`` (a blocking dump fails "Failed to suspend process", and
``--native`` cannot be combined with it). One ``--json`` dump per PID; the text file is rendered
from that same JSON so both views show the same instant.

Files: ``pyspy/<pid>.json`` (py-spy's JSON), ``pyspy/<pid>.txt`` (text), ``pyspy/<pid>.err``
(py-spy's stderr when a dump failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult, StepStatus
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.host.tools import Completed, run_bounded, write_private

STEP_NAME = "py-spy"

FIX_MISSING = "py-spy is not installed: pip install py-spy (or put it on PATH)"
FIX_PERMISSION = (
    "ptrace refused: run the watchdog as root or as the engine's UID, or give it CAP_SYS_PTRACE "
    "(Kubernetes: securityContext.capabilities.add: [SYS_PTRACE] and shareProcessNamespace: "
    "true), or allow same-UID ptrace with sysctl kernel.yama.ptrace_scope=0 (the only way in a "
    "Pod Security Baseline namespace, which forbids SYS_PTRACE; without it no stacks can be "
    "read from outside the engine, and the bundle keeps what /proc shows)"
)

NO_PYTHON = "no Python engine process (native ones are the native-stacks step's)"

# Worst first: the step's status is that of its worst dump when none succeeded.
_FAILURE_ORDER: tuple[StepStatus, ...] = ("permission-denied", "not-available", "timeout", "failed")


@dataclass(frozen=True)
class PySpyOptions:
    native_timeout_s: float = 8.0
    """Cap for the ``--native`` attempt; the plain dump gets what is left of the step's budget."""
    margin_s: float = 1.0
    """Kept back from the step's budget for writing files."""


@dataclass(frozen=True)
class DumpOutcome:
    pid: int
    status: StepStatus
    mode: str
    """native | plain | nonblocking (the attempt that produced the stacks, or the last tried)."""
    detail: str
    files: tuple[str, ...] = ()
    elapsed_s: float = 0.0


def classify_error(stderr: str) -> StepStatus | None:
    """Map py-spy's stderr to a status; None when a different mode may still succeed."""
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return "permission-denied"
    if "failed to suspend process" in low:
        return None
    if "check that the process is running" in low or "no such process" in low:
        return "not-available"
    return "failed"


def read_state_letter(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The state letter of ``/proc/PID/stat`` (R, S, D, T, t, Z...), None if gone."""
    try:
        text = (proc_root / str(pid) / "stat").read_text(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ")".
    rest = text[text.rfind(")") + 1 :].split()
    return rest[0] if rest else None


def is_python(pid: int, proc_root: Path = Path("/proc")) -> bool | None:
    """Whether ``pid`` runs a Python interpreter: its executable is named python*, or it maps
    libpython. None when that cannot be read (gone, or no access): py-spy is tried then. A
    process known to be native (llama.cpp's llama-server) is the native-stacks step's."""
    base = proc_root / str(pid)
    with contextlib.suppress(OSError):
        if Path(os.readlink(base / "exe").removesuffix(" (deleted)")).name.startswith("python"):
            return True
    try:
        with (base / "maps").open("rb") as maps:
            return any(b"libpython" in line for line in maps)
    except OSError:
        return None


def _argv(pyspy: str, pid: int, mode: str) -> list[str]:
    extra = {"native": ["--native"], "plain": [], "nonblocking": ["--nonblocking"]}[mode]
    return [pyspy, "dump", "--pid", str(pid), "--json", *extra]


def _first_line(data: bytes) -> str:
    for line in data.decode(errors="replace").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _next_mode(mode: str, res: Completed) -> str | None:
    """The attempt after ``mode``, or None when the last result stands."""
    if res.rc == 0:
        return None
    if res.timed_out:
        return "plain" if mode == "native" else None
    kind = classify_error(res.stderr.decode(errors="replace"))
    if kind is None:
        # The process was stopped meanwhile: only --nonblocking can read it now.
        return "nonblocking" if mode != "nonblocking" else None
    return "plain" if kind == "failed" and mode == "native" else None


async def _try_modes(
    pyspy: str, pid: int, budget_s: float, opts: PySpyOptions, proc_root: Path
) -> tuple[str, Completed, list[str]]:
    """Run the attempts in order until one succeeds or fails for good."""
    deadline = time.monotonic() + budget_s
    notes: list[str] = []
    mode: str | None = "nonblocking" if read_state_letter(pid, proc_root) == "T" else "native"
    last = ("native", Completed(None, b"", b"", 0.0))
    while mode is not None and (left := deadline - time.monotonic()) > 0:
        bound = min(opts.native_timeout_s, left) if mode == "native" else left
        before = read_state_letter(pid, proc_root)
        res = await run_bounded(_argv(pyspy, pid, mode), bound)
        last = (mode, res)
        if res.timed_out:
            notes.append(f"{mode} timed out after {bound:.1f}s")
            notes.extend(resume_if_left_stopped(pid, before, proc_root))
        elif res.rc != 0:
            notes.append(f"{mode} failed: {_first_line(res.stderr)}")
        mode = _next_mode(mode, res)
    return last[0], last[1], notes


def resume_if_left_stopped(pid: int, before: str | None, proc_root: Path) -> list[str]:
    """A py-spy killed between its ptrace attach and detach can leave the engine stopped; a
    capture must never make things worse, so continue a process we (not the operator) stopped."""
    if before in ("T", None) or read_state_letter(pid, proc_root) != "T":
        return []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGCONT)
        return [f"PID {pid} was left stopped by the killed dump: sent SIGCONT"]
    return []


async def dump_process(
    pyspy: str,
    proc: ProcInfo,
    workdir: Path,
    budget_s: float,
    opts: PySpyOptions = PySpyOptions(),
    proc_root: Path = Path("/proc"),
) -> DumpOutcome:
    """Dump one process's stacks into ``workdir/pyspy/``; never raises for py-spy failures."""
    t0 = time.monotonic()
    mode, res, notes = await _try_modes(pyspy, proc.pid, budget_s, opts, proc_root)
    elapsed = time.monotonic() - t0
    base = f"pyspy/{proc.pid}"
    if res.rc == 0:
        files = await asyncio.to_thread(_write_ok, workdir, base, proc, mode, res)
        detail = "; ".join([f"{mode} dump in {res.elapsed_s:.2f}s", *notes])
        status: StepStatus = "ok" if files[0].endswith(".json") else "partial"
        return DumpOutcome(proc.pid, status, mode, detail, files, elapsed)
    if res.timed_out:
        return DumpOutcome(proc.pid, "timeout", mode, "; ".join(notes), (), elapsed)
    err_name = f"{base}.err"
    await asyncio.to_thread(write_private, workdir / err_name, res.stderr)
    status = classify_error(res.stderr.decode(errors="replace")) or "failed"
    detail = "; ".join(notes)
    if status == "permission-denied":
        detail = f"{detail}. Fix: {FIX_PERMISSION}"
    return DumpOutcome(proc.pid, status, mode, detail, (err_name,), elapsed)


def _write_ok(
    workdir: Path, base: str, proc: ProcInfo, mode: str, res: Completed
) -> tuple[str, ...]:
    try:
        threads = json.loads(res.stdout)
    except ValueError:
        write_private(workdir / f"{base}.txt", _own_header(res.stdout, proc))
        return (f"{base}.txt",)
    write_private(workdir / f"{base}.json", res.stdout)
    text = render_text(proc, mode, threads)
    write_private(workdir / f"{base}.txt", text.encode())
    return (f"{base}.json", f"{base}.txt")


def _own_header(text: bytes, proc: ProcInfo) -> bytes:
    """py-spy's text output begins ``Process PID: COMMAND LINE``, the whole command line and
    its secrets: ours names the process by its title, redacted where it was read."""
    head, nl, rest = text.partition(b"\n")
    if head.startswith(b"Process "):
        head = f"Process {proc.pid}: {proc.title}".encode()
    return head + nl + rest


def render_text(proc: ProcInfo, mode: str, threads: Any) -> str:
    """py-spy's own text layout, from its JSON."""
    lines = [f"Process {proc.pid}: {proc.title}", f"role {proc.role}, py-spy dump ({mode})", ""]
    for th in threads if isinstance(threads, list) else []:
        tag = "active+gil" if th.get("owns_gil") else ("active" if th.get("active") else "idle")
        lines.append(
            f"Thread {th.get('os_thread_id') or th.get('thread_id')} ({tag}): "
            f'"{th.get("thread_name") or ""}"'
        )
        for fr in th.get("frames") or []:
            where = fr.get("short_filename") or fr.get("filename") or "?"
            line = fr.get("line") or 0
            lines.append(
                f"    {fr.get('name')} ({where}:{line})"
                if line
                else f"    {fr.get('name')} ({where})"
            )
    return "\n".join(lines) + "\n"


def _step_status(outcomes: Sequence[DumpOutcome]) -> StepStatus:
    oks = [o for o in outcomes if o.status in ("ok", "partial")]
    if oks:
        return (
            "ok" if len(oks) == len(outcomes) and all(o.status == "ok" for o in oks) else "partial"
        )
    for status in _FAILURE_ORDER:
        if any(o.status == status for o in outcomes):
            return status
    return "failed"


def pyspy_step(opts: PySpyOptions = PySpyOptions(), proc_root: Path = Path("/proc")) -> CaptureStep:
    """The py-spy capture step (see the module docstring)."""

    async def step(ctx: CaptureContext) -> StepResult:
        t0 = time.monotonic()
        pyspy = ctx.tools.get("py-spy")
        if not pyspy or not os.access(pyspy, os.X_OK):
            return StepResult(STEP_NAME, "not-available", detail=FIX_MISSING)
        live = [p for p in ctx.procs if p.state not in ("gone", "zombie")]
        if not live:
            return StepResult(STEP_NAME, "not-available", detail="no live engine process to dump")
        live = [p for p in live if is_python(p.pid, proc_root) is not False]
        if not live:
            return StepResult(STEP_NAME, "not-available", detail=NO_PYTHON)
        budget = max(ctx.timeout_s - opts.margin_s, 0.5)
        try:
            outcomes = await asyncio.gather(
                *(dump_process(pyspy, p, ctx.workdir, budget, opts, proc_root) for p in live)
            )
        except OSError as e:  # vanished or broken between the check and the exec
            return StepResult(STEP_NAME, "not-available", detail=f"{FIX_MISSING} ({e})")
        files = tuple(f for o in outcomes for f in o.files)
        detail = " | ".join(f"{o.pid}: {o.status}, {o.detail}" for o in outcomes)
        return StepResult(STEP_NAME, _step_status(outcomes), files, detail, time.monotonic() - t0)

    step.__name__ = STEP_NAME
    return step
