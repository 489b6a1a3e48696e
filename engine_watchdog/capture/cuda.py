"""Capture step ``cuda-coredump``: a user-triggered CUDA core dump of every CUDA engine process.

DESTRUCTIVE (seen on an H200: the dumped process dies of SIGABRT, docs/gpu-verification.md), so it
runs only when
``ctx.destructive`` is set, i.e. as part of a restart. It works only where the engine was started
with ``CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1`` (read from /proc/PID/environ): the driver then
keeps a FIFO per CUDA process (``CUDA_COREDUMP_PIPE``, default ``corepipe.cuda.%h.%p``); one byte
written to it makes the driver write ``CUDA_COREDUMP_FILE`` (default ``core.cuda.%h.%p``). Every
CUDA process is triggered at once (with TP>1 a dead rank makes the others fail soon after), the
cores are awaited until they stop growing, and each is summarised with ``cuda-gdb -batch``.

Paths are the process's own (its mount namespace, its PID namespace for %p): they are reached
through /proc/PID/root and /proc/PID/cwd, and the FIFO through /proc/PID/fd, so the step also
works from a sidecar container. The core directory is opened before the trigger because
/proc/PID/root disappears with the process.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine_watchdog.capture.procfs import (
    FIX_ENVIRON_PERMISSION,
    abs_pattern,
    alive,
    all_denied,
    fifo_fds,
    is_fifo,
    match_pattern,
    own_pid,
    pattern_regex,
    proc_view,
    read_environ,
    read_environs,
    split_static,
    trigger_and_wait,
)
from engine_watchdog.capture.step import CaptureContext, CaptureStep, StepResult, StepStatus
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.host.tools import copy_private, run_bounded, write_private

NAME = "cuda-coredump"
ENABLE_VAR = "CUDA_ENABLE_USER_TRIGGERED_COREDUMP"
DEFAULT_PIPE = "corepipe.cuda.%h.%p"  # cuda-gdb docs / CUDA driver API, CU_COREDUMP_PIPE
DEFAULT_CORE = "core.cuda.%h.%p"  # CU_COREDUMP_FILE
RECOMMENDED_ENV = (
    f"{ENABLE_VAR}=1 CUDA_COREDUMP_PIPE=/tmp/cuda_pipe_%p "
    "CUDA_COREDUMP_FILE=<shared volume>/cuda_core_%p.nvcudmp CUDA_COREDUMP_GENERATION_FLAGS="
    "skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,"
    "skip_constbank_memory"
)
CORE_WAIT_SHARE = 0.6
"""Share of ctx.timeout_s spent waiting for the cores; the rest is for copies and cuda-gdb."""
GDB_OUTPUT_MAX = 256 * 1024


@dataclass(frozen=True)
class CoreDumpSettings:
    proc_root: Path = Path("/proc")
    copy_max_bytes: int = 256 * 2**20
    """Cores up to this size are copied into the bundle; larger ones stay (path and size noted)."""
    stable_s: float = 1.0
    """A core whose size has not changed for this long, and whose process has exited, is complete
    (with CU_COREDUMP_SKIP_ABORT the process lives on: then three times as long)."""
    poll_s: float = 0.25


@dataclass
class CoreTarget:
    """One CUDA process and what became of its dump."""

    pid: int
    ns_pid: int
    role: str
    pipe: str
    core_pattern: str
    trigger: str = ""
    core_path: str | None = None
    """The core as the dumped process named it."""
    core_size: int = 0
    complete: bool = False
    copied_to: str | None = None
    cuda_gdb_s: float | None = None
    notes: list[str] = field(default_factory=list)
    _dir_fd: int | None = field(default=None, repr=False)
    _pipe_path: Path | None = field(default=None, repr=False)
    _core_rel: str | None = field(default=None, repr=False)
    """The core under the held directory (``_dir_fd``)."""
    _seen: tuple[int, float] = (-1, 0.0)

    def record(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    def core_dir(self) -> Path | None:
        return None if self._dir_fd is None else Path(f"/proc/{os.getpid()}/fd/{self._dir_fd}")


def core_dump_enabled(procs: Iterable[ProcInfo], proc_root: Path = Path("/proc")) -> bool:
    """Some engine process was started with the user-triggered core dump armed (blocking)."""
    for p in procs:
        try:
            if read_environ(proc_root, p.pid).get(ENABLE_VAR) == "1":
                return True
        except OSError:
            continue
    return False


def discover(proc_root: Path, procs: Iterable[ProcInfo]) -> tuple[list[CoreTarget], dict[int, str]]:
    """CUDA processes with a core dump pipe, and why each other process was skipped."""
    targets: list[CoreTarget] = []
    skipped: dict[int, str] = {}
    for p, env in read_environs(proc_root, procs, skipped):
        if env.get(ENABLE_VAR) != "1":
            skipped[p.pid] = f"{ENABLE_VAR}=1 not in its environment"
            continue
        target = _target(proc_root, p, env)
        if target is None:
            skipped[p.pid] = "no core dump pipe open: not a CUDA process (or CUDA not started)"
        else:
            targets.append(target)
    return targets, skipped


def _target(proc_root: Path, p: ProcInfo, env: dict[str, str]) -> CoreTarget | None:
    ns_pid = own_pid(proc_root, p.pid)
    pipe_pattern = abs_pattern(proc_root, p.pid, env.get("CUDA_COREDUMP_PIPE") or DEFAULT_PIPE)
    found = fifo_fds(proc_root, p.pid, pattern_regex(pipe_pattern, ns_pid))
    if found:
        pipe_path, pipe_name = found[0]
    else:  # the driver may hold the FIFO without an fd we can see: look for the path itself
        static, rest = split_static(pipe_pattern)
        paths = match_pattern(proc_view(proc_root, p.pid, static), rest, ns_pid)
        fifos = [x for x in paths if is_fifo(x)]
        if not fifos:
            return None
        pipe_path, pipe_name = fifos[0], str(fifos[0])
    core = abs_pattern(proc_root, p.pid, env.get("CUDA_COREDUMP_FILE") or DEFAULT_CORE)
    t = CoreTarget(p.pid, ns_pid, p.role, pipe_name, core, _pipe_path=pipe_path)
    static, _ = split_static(core)
    try:
        t._dir_fd = os.open(proc_view(proc_root, p.pid, static), os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        t.notes.append(f"core directory {static} not reachable: {e.strerror}")
    return t


def poll_core(t: CoreTarget, proc_root: Path, now: float, stable_s: float) -> None:
    """Find the core and mark it complete once it has stopped growing."""
    base = t.core_dir()
    if base is None or t.complete:
        return
    _, rest = split_static(t.core_pattern)
    found = match_pattern(base, rest, t.ns_pid, suffix=r"(?:\.gz)?")
    if not found:
        return
    core = found[-1]
    try:
        size = core.stat().st_size
    except OSError:
        return
    t._core_rel = str(core.relative_to(base))
    t.core_path = f"{split_static(t.core_pattern)[0].rstrip('/')}/{t._core_rel}"
    if size != t._seen[0]:
        t._seen, t.core_size = (size, now), size
        return
    quiet = now - t._seen[1]
    gone = not alive(proc_root, t.pid)
    t.complete = size > 0 and quiet >= (stable_s if gone else 3 * stable_s)


def make_cuda_coredump_step(settings: CoreDumpSettings = CoreDumpSettings()) -> CaptureStep:
    """The step (destructive: it runs only when ``ctx.destructive`` is set)."""

    async def cuda_coredump_step(ctx: CaptureContext) -> StepResult:
        t0 = time.monotonic()
        if not ctx.destructive:
            detail = "skipped: a CUDA core dump kills the process; it runs only with a restart"
            return StepResult(NAME, "not-available", detail=detail)
        targets, skipped = await asyncio.to_thread(discover, settings.proc_root, ctx.procs)
        try:
            status, detail = await _run(ctx, settings, targets, skipped, t0)
        finally:
            for t in targets:
                if t._dir_fd is not None:
                    os.close(t._dir_fd)
        files = tuple(
            sorted(str(p.relative_to(ctx.workdir)) for p in (ctx.workdir / "cuda").glob("*"))
        )
        return StepResult(NAME, status, files, detail, time.monotonic() - t0)

    return cuda_coredump_step


async def _run(
    ctx: CaptureContext,
    settings: CoreDumpSettings,
    targets: list[CoreTarget],
    skipped: dict[int, str],
    t0: float,
) -> tuple[StepStatus, str]:
    if not targets:
        return _nothing_to_do(skipped)
    await _trigger_and_wait(targets, settings, t0 + ctx.timeout_s * CORE_WAIT_SHARE)
    out = ctx.workdir / "cuda"
    out.mkdir(mode=0o700, exist_ok=True)
    deadline = t0 + ctx.timeout_s
    await asyncio.gather(
        *(_summarise(t, out, ctx, deadline, settings.copy_max_bytes) for t in targets)
    )
    record = {"targets": [t.record() for t in targets], "skipped": skipped}
    write_private(out / "cores.json", json.dumps(record, indent=1).encode())
    done = [t for t in targets if t.complete]
    detail = f"{len(done)}/{len(targets)} CUDA processes dumped: " + ", ".join(
        f"{t.pid} {t.core_size} B" if t.complete else f"{t.pid} {t.trigger}" for t in targets
    )
    if len(done) == len(targets):
        return "ok", detail
    triggered = any(t.trigger == "ok" for t in targets)
    return ("partial" if done else "timeout" if triggered else "failed"), detail


async def _trigger_and_wait(
    targets: list[CoreTarget], settings: CoreDumpSettings, wait_until: float
) -> None:
    await trigger_and_wait(
        targets,
        [t._pipe_path or Path(t.pipe) for t in targets],
        lambda t, now: poll_core(t, settings.proc_root, now, settings.stable_s),
        settings.poll_s,
        wait_until,
    )


def _nothing_to_do(skipped: dict[int, str]) -> tuple[StepStatus, str]:
    if all_denied(skipped):
        return "permission-denied", FIX_ENVIRON_PERMISSION
    if not any("no core dump pipe" in r for r in skipped.values()):
        return (
            "not-available",
            f"no engine process has {ENABLE_VAR}=1: start it with {RECOMMENDED_ENV}",
        )
    return "not-available", "no CUDA core dump pipe found: " + "; ".join(
        f"{pid}: {why}" for pid, why in skipped.items()
    )


async def _summarise(
    t: CoreTarget, out: Path, ctx: CaptureContext, deadline: float, cap: int
) -> None:
    lines = [f"pid {t.pid} (own pid {t.ns_pid}, {t.role}); pipe {t.pipe}; trigger: {t.trigger}"]
    base = t.core_dir()
    core = base / t._core_rel if base is not None and t._core_rel else None
    lines.append(f"core: {t.core_path} {t.core_size} bytes, complete={t.complete}")
    if core is not None and t.complete and t.core_size <= cap:
        dest = out / f"{t.pid}.nvcudmp"
        await asyncio.to_thread(copy_private, core, dest)
        t.copied_to, core = f"cuda/{dest.name}", dest
    elif t.complete:
        t.notes.append(f"core larger than the copy cap ({cap} bytes): left at {t.core_path}")
    gdb = ctx.tools.get("cuda-gdb")
    if core is not None and t.complete and gdb:
        lines.append(await _cuda_gdb(t, gdb, core, deadline))
    elif t.complete:
        lines.append(
            f"cuda-gdb not installed; summarise with: cuda-gdb -batch -ex 'target cudacore "
            f"{t.core_path}' -ex 'info cuda kernels' -ex 'bt'"
        )
    write_private(out / f"{t.pid}.txt", ("\n".join(lines + t.notes) + "\n").encode())


async def _cuda_gdb(t: CoreTarget, gdb: str, core: Path, deadline: float) -> str:
    cmds = [f"target cudacore {core}", "info cuda kernels", "bt"]
    argv = [gdb, "-batch", *(x for c in cmds for x in ("-ex", c))]
    try:
        res = await run_bounded(argv, max(1.0, deadline - time.monotonic()))
    except OSError as e:
        return f"cuda-gdb could not start: {e}"
    if res.timed_out:
        return f"cuda-gdb timed out after {res.elapsed_s:.1f} s"
    t.cuda_gdb_s = round(res.elapsed_s, 2)
    text = (res.stdout + res.stderr)[:GDB_OUTPUT_MAX].decode(errors="replace")
    return f"cuda-gdb ({t.cuda_gdb_s} s, rc {res.rc}):\n{text}"
