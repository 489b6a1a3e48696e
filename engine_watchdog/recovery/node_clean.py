"""After a group's ranks are stopped: is this node clean, and clean only the engine's leftovers.

A restarted group that starts on a dirty node fails in ways that look like the hang it
replaced: a rank that outlived the restart still holds its GPU (the new engine's allocation
fails, or two processes share the device), the dead ranks' NCCL shared-memory segments stay
in /dev/shm (killed ranks never unlink them: NVIDIA/nccl#1518) until it is full and the next
NCCL init fails ("Error while creating shared memory segment", NVIDIA/nccl#525; a DP=16
deployment crash-looping on it: llm-d/llm-d#352), vLLM's MessageQueue buffers linger.

Checked, in order (docs/multi-node.md, "Node clean after a group restart"):

1. Processes that are the engine's: of the engine's UID, and either in its process tree (the
   recorded processes, identified by PID and start time, and their descendants) or in one of
   its sessions (a worker reparented to init when its parent died keeps its session), started
   no earlier than the engine. Each still running is ended (SIGCONT, SIGTERM, SIGKILL after a
   grace); a zombie is reported (its parent must reap it).
2. The GPUs: NVML's compute processes (``nvmlDeviceGetComputeRunningProcesses``). One of the
   engine's is ended as above; any other is reported and left alone, with the reason.
3. Shared memory under the shm root (``/dev/shm``): files named as NCCL (``nccl-XXXXXX``,
   ``nccl-shm-*`` in older releases), torch (``torch_*``) and vLLM (``psm_*``, Python's
   SharedMemory names its MessageQueue buffers get; ``vllm_*`` its offload regions) create
   them, owned by the engine's UID and held (mapped or open) by no live process. Those are
   removed; any other is reported and left.

Never touched: a process of another UID, a process of the engine's UID outside its tree and
sessions, a file of another UID or one a live process still holds. Host access is passed in
(the process list, the NVML module, the shm root): recovery never probes. Blocking: run it in
``asyncio.to_thread``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine_watchdog.host.proclist import FileId, HostProc, ProcessList
from engine_watchdog.host.tools import write_private

SHM_PATTERNS = ("nccl-*", "torch_*", "psm_*", "vllm_*")
REPORT_FILE = "node-clean.json"
GRACE_S = 5.0
KILL_WAIT_S = 5.0
POLL_S = 0.05
GPU_RELEASE_S = 15.0
"""How long NVML may go on listing a GPU process after it ended before its memory counts as
held (the driver tears the context down after the process)."""

ItemKind = Literal["gpu-process", "gpu-memory", "process", "zombie", "shm"]


@dataclass(frozen=True)
class EngineRef:
    """What makes a process on this node the watched engine's."""

    uid: int
    procs: tuple[HostProc, ...]
    """The engine's recorded processes (its ranks, its API server): PID and start time."""
    sessions: frozenset[int] = frozenset()
    """Sessions the engine's processes belong to (a process group leader's PID)."""


@dataclass(frozen=True)
class CleanItem:
    kind: ItemKind
    what: str
    """``PID 123 (python3)`` or the file's path."""
    removed: bool
    reason: str
    """Why it was removed, or why it was left."""
    ours: bool
    """It is the engine's: one left behind means the node is not clean."""
    pid: int | None = None
    uid: int | None = None


@dataclass(frozen=True)
class CleanReport:
    """What was found on the node, what was removed, what was left and why."""

    items: tuple[CleanItem, ...] = ()
    errors: tuple[str, ...] = field(default=())
    """What could not be checked (NVML not available, the shm root unreadable)."""

    @property
    def removed(self) -> tuple[CleanItem, ...]:
        return tuple(i for i in self.items if i.removed)

    @property
    def left(self) -> tuple[CleanItem, ...]:
        return tuple(i for i in self.items if not i.removed)

    @property
    def clean(self) -> bool:
        """Nothing of the engine's is left (other UIDs' processes and files may be). A zombie
        does not count: it holds no memory, GPU or file, only its PID until its parent (init,
        once the engine's processes are gone) reaps it."""
        return not any(i.ours and i.kind != "zombie" for i in self.left)

    def as_dict(self) -> dict[str, Any]:
        """The bundle's ``node-clean.json``."""
        return {
            "clean": self.clean,
            "removed": [asdict(i) for i in self.removed],
            "left": [asdict(i) for i in self.left],
            "errors": list(self.errors),
        }


def write_report(report: CleanReport, bundle_dir: Path) -> Path:
    """``<bundle>/node-clean.json`` (0600, never overwritten); OSError propagates."""
    path = bundle_dir / REPORT_FILE
    write_private(path, json.dumps(report.as_dict(), indent=2).encode())
    return path


def clean_node(
    engine: EngineRef,
    procs: ProcessList,
    nvml: Any | None,
    shm_root: Path = Path("/dev/shm"),
    patterns: Sequence[str] = SHM_PATTERNS,
    grace_s: float = GRACE_S,
    gpu_release_s: float = GPU_RELEASE_S,
) -> CleanReport:
    """Check the node after the engine's ranks were stopped, and remove the engine's leftovers
    (see the module docstring). Blocking."""
    errors: list[str] = []
    table = procs.processes()
    mine = engine_processes(engine, table)
    gpu_pids = _gpu_pids(nvml, errors)
    items = [_foreign_gpu(pid, table, engine) for pid in sorted(gpu_pids - set(mine))]
    items += _end(procs, [mine[pid] for pid in sorted(mine)], gpu_pids, grace_s)
    ended = {i.pid for i in items if i.kind == "gpu-process" and i.removed and i.pid is not None}
    items += _gpu_released(nvml, ended, gpu_release_s)
    items += _clean_shm(engine.uid, procs, shm_root, patterns, errors)
    return CleanReport(tuple(items), tuple(errors))


def _gpu_released(nvml: Any | None, ended: set[int], timeout_s: float) -> list[CleanItem]:
    """Wait until NVML no longer lists the GPU processes just ended: the driver tears a CUDA
    context down after its process has gone (on an H200, NVML still listed a SIGTERMed worker
    50 ms after it exited: docs/gpu-verification.md). One still listed is GPU memory left."""
    deadline = time.monotonic() + timeout_s
    still = set(ended)
    while still and nvml is not None:
        still &= _gpu_pids(nvml, [])
        if not still or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    why = f"NVML still lists it on a GPU {timeout_s:g} s after it ended: GPU memory held"
    return [CleanItem("gpu-memory", f"PID {pid}", False, why, True, pid) for pid in sorted(still)]


def engine_processes(engine: EngineRef, table: Mapping[int, HostProc]) -> dict[int, HostProc]:
    """The live processes of the engine's UID in its tree or its sessions, by PID."""
    roots = [p for p in engine.procs if _same(table.get(p.pid), p)]
    since = min((p.started for p in engine.procs), default=0.0)
    tree = {p.pid for p in roots}
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    todo = list(tree)
    while todo:
        for kid in children.get(todo.pop(), ()):
            if kid not in tree:
                tree.add(kid)
                todo.append(kid)
    for proc in table.values():
        if proc.sid in engine.sessions and proc.started >= since:
            tree.add(proc.pid)
    return {pid: table[pid] for pid in tree if table[pid].uid == engine.uid}


def _same(live: HostProc | None, recorded: HostProc) -> bool:
    return live is not None and live.started == recorded.started


def _gpu_pids(nvml: Any | None, errors: list[str]) -> set[int]:
    """Every PID NVML lists as a compute process, on every GPU."""
    if nvml is None:
        errors.append("GPUs not checked: NVML not available (nvidia-ml-py not installed)")
        return set()
    pids: set[int] = set()
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError and what a broken driver raises
        errors.append(f"GPUs not checked: nvmlInit failed: {exc}")
        return pids
    try:
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            pids |= {int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception as exc:
        errors.append(f"GPUs checked in part: {exc}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:
            errors.append(f"nvmlShutdown failed: {exc}")
    return pids


def _foreign_gpu(pid: int, table: Mapping[int, HostProc], engine: EngineRef) -> CleanItem:
    """A GPU process that is not the engine's: left, and why."""
    proc = table.get(pid)
    if proc is None:
        why = "not visible in this node's PID namespace"
        return CleanItem("gpu-process", f"PID {pid}", False, why, False, pid)
    if proc.uid != engine.uid:
        why = f"UID {proc.uid}, not the engine's ({engine.uid})"
    else:
        why = "the engine's UID, but outside its process tree and sessions"
    return CleanItem("gpu-process", _name(proc), False, why, False, pid, proc.uid)


def _name(proc: HostProc) -> str:
    return f"PID {proc.pid} ({proc.name})" if proc.name else f"PID {proc.pid}"


def _end(
    procs: ProcessList, mine: list[HostProc], gpu_pids: set[int], grace_s: float
) -> list[CleanItem]:
    """End the engine's live processes (zombies are their parents' to reap); report each."""
    stubborn, left = end_processes(procs, [p for p in mine if p.status != "zombie"], grace_s)
    items = []
    for proc in mine:
        kind: ItemKind = "gpu-process" if proc.pid in gpu_pids else "process"
        if proc.status == "zombie":
            why = f"a zombie: its parent (PID {proc.ppid}) must reap it"
            items.append(CleanItem("zombie", _name(proc), False, why, True, proc.pid, proc.uid))
        elif proc in left:
            items.append(CleanItem(kind, _name(proc), False, "survived SIGKILL", True, proc.pid))
        else:
            how = f"SIGKILL after {grace_s:g} s" if proc in stubborn else "SIGTERM"
            why = f"the engine's, still running after the stop: ended ({how})"
            items.append(CleanItem(kind, _name(proc), True, why, True, proc.pid, proc.uid))
    return items


def end_processes(
    procs: ProcessList, live: Sequence[HostProc], grace_s: float = GRACE_S
) -> tuple[list[HostProc], list[HostProc]]:
    """SIGCONT (a stopped process cannot act on SIGTERM), SIGTERM, SIGKILL after ``grace_s``;
    only the listed processes, each checked by PID and start time. Returns (those that needed
    SIGKILL, those that survived it). Blocking."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        for proc in live:
            procs.signal(proc, sig)
    stubborn = _wait_gone(procs, list(live), grace_s)
    for proc in stubborn:
        procs.signal(proc, signal.SIGKILL)
    return stubborn, _wait_gone(procs, stubborn, KILL_WAIT_S)


def _wait_gone(procs: ProcessList, which: list[HostProc], timeout_s: float) -> list[HostProc]:
    """Wait until each has exited (a zombie has); return those still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        table = procs.processes()
        left = [p for p in which if _same(table.get(p.pid), p) and table[p.pid].status != "zombie"]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def _clean_shm(
    uid: int, procs: ProcessList, root: Path, patterns: Sequence[str], errors: list[str]
) -> list[CleanItem]:
    """Remove the engine's stale segments under ``root``; report every matching file."""
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        errors.append(f"{root} not checked: {exc.strerror}")
        return []
    found: dict[Path, os.stat_result] = {}
    for name in names:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            try:
                st = (root / name).lstat()  # a link is not a segment: never followed
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found[root / name] = st
    held = procs.holders((st.st_dev, st.st_ino) for st in found.values())
    return [_one_segment(path, st, uid, held) for path, st in found.items()]


def _one_segment(
    path: Path, st: os.stat_result, uid: int, held: Mapping[FileId, frozenset[int]]
) -> CleanItem:
    if st.st_uid != uid:
        why = f"owned by UID {st.st_uid}, not the engine's ({uid})"
        return CleanItem("shm", str(path), False, why, False, uid=st.st_uid)
    holders = sorted(held.get((st.st_dev, st.st_ino), ()))
    if holders:
        why = "in use by PID " + ", ".join(map(str, holders))
        return CleanItem("shm", str(path), False, why, False, uid=st.st_uid)
    try:
        path.unlink()
    except OSError as exc:
        why = f"could not be removed: {exc.strerror}"
        return CleanItem("shm", str(path), False, why, True, uid=st.st_uid)
    why = f"stale: the engine's UID, held by no process ({st.st_size} bytes freed)"
    return CleanItem("shm", str(path), True, why, True, uid=st.st_uid)
