"""Capture step: native stacks of the engine processes that are not Python (llama.cpp's
llama-server), with ``eu-stack`` from elfutils; py-spy cannot read them.

Why eu-stack and not gdb in batch mode: on the same process (9 threads) eu-stack paused it no
longer than a py-spy dump does, where gdb paused it 0.4-1.8 s (gdb loads its Python scripts and
every library's symbols first); and elfutils is 4.6 MB installed against gdb's 11.6 MB and its
libraries (docs/bundle.md "Native stacks"). eu-stack attaches with ptrace, unwinds each thread
from the ELF symbol tables (a stripped binary shows addresses only) and detaches.

One ``eu-stack -m -p PID`` per process, bounded by the step's timeout; ``DEBUGINFOD_URLS`` is
dropped from its environment so it never reaches for a debuginfod server. A stopped process
(state T) is read as it is and left stopped. Files: ``native/<pid>.txt`` (eu-stack's text) and
``native/<pid>.json`` (the threads in py-spy's JSON shape, so the summary reads both alike).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_watchdog.capture.pyspy import is_python, read_state_letter, resume_if_left_stopped
from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult, StepStatus
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.host.tools import run_bounded, write_private

STEP_NAME = "native-stacks"
TOOL = "eu-stack"
FIX_MISSING = "eu-stack is not installed: apt-get install elfutils (or put eu-stack on PATH)"

_THREAD = re.compile(r"^TID (\d+):$")
_FRAME = re.compile(r"^#\d+\s+0x([0-9a-f]+)(?:\s+(.*))?$")


@dataclass(frozen=True)
class NativeOptions:
    margin_s: float = 1.0
    """Kept back from the step's budget for writing files."""


def parse_eu_stack(text: str, pid: int, proc_root: Path = Path("/proc")) -> list[dict[str, Any]]:
    """``eu-stack -m`` text -> py-spy's JSON thread shape (name, filename = module, line 0)."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        head = _THREAD.match(line.strip())
        if head:
            tid = int(head.group(1))
            name, state = _thread_name_state(pid, tid, proc_root)
            threads.append(
                {
                    "thread_id": tid,
                    "os_thread_id": tid,
                    "thread_name": name,
                    "active": state == "R",
                    "owns_gil": False,
                    "frames": [],
                }
            )
            continue
        frame = _FRAME.match(line.strip())
        if frame and threads:
            rest = frame.group(2) or ""
            if rest.startswith("- "):  # no symbol: the address and its module only
                func, module = "", rest[2:]
            else:
                func, _, module = rest.rpartition(" - ") if " - " in rest else (rest, "", "")
            func = func.strip().split("@", 1)[0] or f"0x{frame.group(1)}"
            threads[-1]["frames"].append(
                {"name": func, "filename": module.strip(), "line": 0, "module": module.strip()}
            )
    return threads


def _thread_name_state(pid: int, tid: int, proc_root: Path) -> tuple[str, str | None]:
    task = proc_root / str(pid) / "task" / str(tid)
    try:
        name = (task / "comm").read_text(errors="replace").strip()
    except OSError:
        name = ""
    stat = proc_root / str(pid) / "task"
    return name, read_state_letter(tid, stat)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DEBUGINFOD_")}


async def dump_native(
    tool: str, proc: ProcInfo, workdir: Path, budget_s: float, proc_root: Path = Path("/proc")
) -> tuple[StepStatus, str, tuple[str, ...]]:
    """One process's native stacks into ``workdir/native/``: (status, detail, files)."""
    before = read_state_letter(proc.pid, proc_root)
    res = await run_bounded([tool, "-m", "-p", str(proc.pid)], budget_s, env=_env())
    if res.timed_out:
        notes = resume_if_left_stopped(proc.pid, before, proc_root)
        return "timeout", "; ".join([f"eu-stack timed out after {budget_s:.1f}s", *notes]), ()
    text = res.stdout.decode(errors="replace")
    threads = parse_eu_stack(text, proc.pid, proc_root)
    err = res.stderr.decode(errors="replace").strip()
    if not threads:
        low = err.lower()
        status: StepStatus = "failed"
        if "operation not permitted" in low or "permission denied" in low:
            status = "permission-denied"
        elif "no such process" in low:
            status = "not-available"
        return status, f"eu-stack exit {res.rc}: {err.splitlines()[0][:300] if err else ''}", ()
    base = f"native/{proc.pid}"
    head = f"Process {proc.pid}: {proc.title}\nrole {proc.role}, eu-stack (state {before})\n\n"
    await asyncio.to_thread(write_private, workdir / f"{base}.txt", (head + text).encode())
    await asyncio.to_thread(
        write_private, workdir / f"{base}.json", json.dumps(threads, indent=1).encode()
    )
    # exit 1: some frames could not be unwound (eu-stack's own meaning); the stacks still stand
    status = "ok" if res.rc == 0 else "partial"
    detail = f"{len(threads)} threads in {res.elapsed_s:.2f}s"
    if res.rc != 0 and err:
        detail += f" ({err.splitlines()[0][:200]})"
    return status, detail, (f"{base}.json", f"{base}.txt")


def native_step(
    opts: NativeOptions = NativeOptions(), proc_root: Path = Path("/proc")
) -> CaptureStep:
    """The native-stacks capture step (see the module docstring)."""

    async def step(ctx: CaptureContext) -> StepResult:
        t0 = time.monotonic()
        live = [p for p in ctx.procs if p.state not in ("gone", "zombie")]
        native = [p for p in live if is_python(p.pid, proc_root) is False]
        if not native:
            return StepResult(STEP_NAME, "not-available", detail="no native engine process")
        tool = ctx.tools.get(TOOL)
        if not tool or not os.access(tool, os.X_OK):
            return StepResult(STEP_NAME, "not-available", detail=FIX_MISSING)
        budget = max(ctx.timeout_s - opts.margin_s, 0.5)
        try:
            results = await asyncio.gather(
                *(dump_native(tool, p, ctx.workdir, budget, proc_root) for p in native)
            )
        except OSError as e:
            return StepResult(STEP_NAME, "not-available", detail=f"{FIX_MISSING} ({e})")
        files = tuple(f for _, _, fs in results for f in fs)
        detail = " | ".join(
            f"{p.pid}: {s}, {d}" for p, (s, d, _) in zip(native, results, strict=True)
        )
        statuses = [s for s, _, _ in results]
        status: StepStatus
        if all(s == "ok" for s in statuses):
            status = "ok"
        elif files:
            status = "partial"
        else:
            status = next(
                (s for s in ("permission-denied", "not-available", "timeout") if s in statuses),
                "failed",
            )
        return StepResult(STEP_NAME, status, files, detail, time.monotonic() - t0)

    step.__name__ = STEP_NAME
    return step
