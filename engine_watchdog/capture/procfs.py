"""Another process's view of the world, read through a /proc root, and the FIFOs it holds open.

Shared by the steps that make an engine process dump through a FIFO of its own (CUDA core dumps,
the NCCL flight recorder): its environment, its PID as it sees itself, its paths as it names
them (its own root and cwd, reached through /proc/PID/root and /proc/PID/cwd), path patterns
with %-tokens (``%p``, ``%h``, ``%t``), and one-byte triggers. The /proc root is passed in: a fake
one in tests.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from engine_watchdog.core.model import ProcInfo
from engine_watchdog.probes.pidns import read_nspid, read_status_field

DIR_SCAN_MAX = 10_000
ENVIRON_DENIED = "permission denied reading /proc/PID/environ"
FIX_ENVIRON_PERMISSION = (
    "cannot read the engine's /proc/PID/environ: run the watchdog as the engine's user or with "
    "CAP_SYS_PTRACE, in the engine's PID namespace (Kubernetes: shareProcessNamespace: true)"
)


# ---- the process itself -----------------------------------------------------------------------


ANCESTOR_HOPS = 8
"""How far up the process tree an environment zeroed by setproctitle is looked for."""


def read_environ(proc_root: Path, pid: int) -> dict[str, str]:
    """The process's environment at exec time (see :func:`environ_of`). Raises OSError
    (PermissionError, gone)."""
    return environ_of(proc_root, pid)[0]


def environ_of(proc_root: Path, pid: int) -> tuple[dict[str, str], int]:
    """(environment, PID it was read from). setproctitle, which vLLM's engine cores and workers
    call, zeroes /proc/PID/environ (unless SPT_NOENV is set); a child's environment is its
    parent's, so an empty one is read from the nearest ancestor that has one. Raises OSError
    when the process's own file cannot be read."""
    env = _parse_environ((proc_root / str(pid) / "environ").read_bytes())
    current = pid
    for _ in range(ANCESTOR_HOPS):
        if env:
            return env, current
        ppid = read_status_field(current, "PPid", proc_root)
        parent = int(ppid) if ppid and ppid.isdigit() else None
        if parent is None or parent <= 1:
            break
        current = parent
        try:
            env = _parse_environ((proc_root / str(current) / "environ").read_bytes())
        except OSError:
            break
    return {}, pid


def _parse_environ(raw: bytes) -> dict[str, str]:
    env = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def read_environs(
    proc_root: Path, procs: Iterable[ProcInfo], skipped: dict[int, str]
) -> Iterator[tuple[ProcInfo, dict[str, str]]]:
    """(process, environment) for each process whose environment can be read; why each other
    one cannot goes into ``skipped`` (in process order)."""
    for p in procs:
        try:
            env = read_environ(proc_root, p.pid)
        except PermissionError:
            skipped[p.pid] = ENVIRON_DENIED
            continue
        except OSError:
            skipped[p.pid] = "process gone"
            continue
        yield p, env


def all_denied(skipped: dict[int, str]) -> bool:
    """True when every process was skipped for want of permission (the fix is the same)."""
    return bool(skipped) and all(r.startswith("permission denied") for r in skipped.values())


def own_pid(proc_root: Path, pid: int) -> int:
    """The PID the process sees for itself (innermost NSpid): what %p expands to."""
    ns = read_nspid(proc_root, pid)
    return ns[-1] if ns else pid


def alive(proc_root: Path, pid: int) -> bool:
    """False once the process is gone or a zombie."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return False
    return text.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


# ---- its paths and path patterns --------------------------------------------------------------


def pattern_regex(pattern: str, pid: int, suffix: str = "") -> re.Pattern[str]:
    """A regex for a CUDA path pattern: %p -> pid, %h -> a host name, %t -> a time, %% -> %."""
    tokens = {"p": re.escape(str(pid)), "h": r"[^/]+", "t": r"\d+", "%": "%"}
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern) and pattern[i + 1] in tokens:
            out.append(tokens[pattern[i + 1]])
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + suffix)


def expand_pattern(pattern: str, pid: int, hostname: str) -> str:
    """The pattern with %p and %h filled in (%t stays: only the driver knows that time)."""
    return (
        pattern.replace("%%", "\0")
        .replace("%p", str(pid))
        .replace("%h", hostname)
        .replace("\0", "%")
    )


def split_static(pattern: str) -> tuple[str, str]:
    """(leading directory with no %-token, the rest): ``/tmp/a_%p/x`` -> (``/tmp``, ``a_%p/x``)."""
    parts = pattern.split("/")
    n = 0
    while n < len(parts) - 1 and "%" not in parts[n]:
        n += 1
    static = "/".join(parts[:n])
    return (static or ("/" if pattern.startswith("/") else ".")), "/".join(parts[n:])


def abs_pattern(proc_root: Path, pid: int, pattern: str) -> str:
    """A relative pattern made absolute against the process's cwd (as the process sees it)."""
    if pattern.startswith("/"):
        return pattern
    try:
        return os.readlink(proc_root / str(pid) / "cwd").rstrip("/") + "/" + pattern
    except OSError:
        return pattern


def proc_view(proc_root: Path, pid: int, path: str) -> Path:
    """Our way to a path as the process sees it (its root and cwd may not be ours)."""
    if path.startswith("/"):
        return proc_root / str(pid) / "root" / path.lstrip("/")
    return proc_root / str(pid) / "cwd" / path


def match_pattern(base: Path, rest: str, pid: int, suffix: str = "") -> list[Path]:
    """Existing paths under ``base`` matching ``rest`` component by component (bounded scan)."""
    found = [base]
    comps = [c for c in rest.split("/") if c]
    for n, comp in enumerate(comps):
        last = n == len(comps) - 1
        if "%" not in comp and not (last and suffix):
            found = [p / comp for p in found]
            continue
        rx = pattern_regex(comp, pid, suffix if last else "")
        found = [p / name for p in found for name in list_dir(p) if rx.fullmatch(name)]
    return [p for p in found if os.path.lexists(p)]


def list_dir(path: Path) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(e.name for _, e in zip(range(DIR_SCAN_MAX), it, strict=False))
    except OSError:
        return []


# ---- its FIFOs ----------------------------------------------------------------------------------


def is_fifo(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def fifo_fds(proc_root: Path, pid: int, rx: re.Pattern[str]) -> list[tuple[Path, str]]:
    """(/proc/PID/fd/N, target) for each open FIFO whose target path matches ``rx``."""
    fd_dir = proc_root / str(pid) / "fd"
    out = []
    for name in list_dir(fd_dir):
        try:
            target = os.readlink(fd_dir / name)
            if rx.fullmatch(target) and stat.S_ISFIFO(os.stat(fd_dir / name).st_mode):
                out.append((fd_dir / name, target))
        except OSError:
            continue
    return out


def trigger_fifo(path: Path) -> str:
    """Write one byte without blocking: 'ok', or why not (ENXIO: nobody reads the pipe)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        return f"open failed: {e.strerror} ({path})"
    try:
        os.write(fd, b"1")
    except OSError as e:
        return f"write failed: {e.strerror}"
    finally:
        os.close(fd)
    return "ok"


class Dump(Protocol):
    """A dump asked for through a FIFO: how the trigger went, and whether the dump is complete."""

    trigger: str
    complete: bool


D = TypeVar("D", bound=Dump)


async def trigger_and_wait(
    dumps: Sequence[D],
    pipes: Sequence[Path],
    poll: Callable[[D, float], None],
    poll_s: float,
    wait_until: float,
) -> None:
    """Trigger every dump through its pipe at once, then ``poll(dump, now)`` the triggered ones
    every ``poll_s`` until each is complete or ``wait_until`` (monotonic) has passed.

    All at once: a CUDA core dump kills its rank and the peers fail soon after, so no rank may
    wait for another's trigger (flight-recorder dumps are then also from one moment).
    """
    results = await asyncio.to_thread(lambda: [trigger_fifo(p) for p in pipes])
    for d, result in zip(dumps, results, strict=True):
        d.trigger = result
    pending = [d for d in dumps if d.trigger == "ok"]
    while pending and time.monotonic() < wait_until:
        await asyncio.sleep(poll_s)
        for d in pending:
            poll(d, time.monotonic())
        pending = [d for d in pending if not d.complete]
