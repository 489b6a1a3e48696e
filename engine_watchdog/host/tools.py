"""Host helpers shared by the capture steps: tool lookup, bounded subprocesses, private files.

Every subprocess runs in its own session (process group) so a timeout or a cancellation kills it
and anything it started; nothing here uses a shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_watchdog.host.pdeathsig import wrap

TOOL_NAMES = ("py-spy", "cuda-gdb", "eu-stack")

_KILL_WAIT_S = 5.0


def find_tool(name: str, path: str | None = None) -> str | None:
    """Absolute path of ``name`` on PATH, else beside this Python (a venv's bin is often not on
    PATH when the watchdog runs as ``.venv/bin/python -m engine_watchdog``)."""
    found = shutil.which(name, path=path)
    if found:
        return found
    if path is None:
        beside = Path(sys.executable).parent / name
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
    return None


def resolve_tools(path: str | None = None) -> dict[str, str]:
    """Tool name -> path for every known tool that exists (``CaptureContext.tools``)."""
    found = {name: find_tool(name, path) for name in TOOL_NAMES}
    return {name: p for name, p in found.items() if p}


def tools_with(py_spy: str | None) -> dict[str, str]:
    """The tools found, with the operator's own py-spy where given (left out if it is not an
    executable file: the py-spy step then says it is missing)."""
    tools = resolve_tools()
    if py_spy is not None:
        tools.pop("py-spy", None)
        if Path(py_spy).is_file() and os.access(py_spy, os.X_OK):
            tools["py-spy"] = str(Path(py_spy).resolve())
    return tools


@dataclass(frozen=True)
class Completed:
    """A finished (or killed) subprocess."""

    rc: int | None
    """Exit status; None when it ran past its timeout and was killed."""
    stdout: bytes
    stderr: bytes
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return self.rc is None


async def run_bounded(
    argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None
) -> Completed:
    """Run ``argv`` with a wall-clock bound; kill its process group on timeout or cancellation,
    and let the kernel kill it when the watchdog dies (host/pdeathsig.py): a py-spy left
    attached to the engine by a killed watchdog must not run on.

    ``env`` replaces the environment (None: the watchdog's own).
    Raises OSError when the program cannot be started (missing, not executable).
    """
    t0 = time.monotonic()
    if shutil.which(argv[0]) is None:  # said here: the wrapper would only exit 127
        raise FileNotFoundError(errno.ENOENT, "not an executable program", argv[0])
    proc = await asyncio.create_subprocess_exec(
        *wrap(argv, signal.SIGKILL),  # dies with the watchdog, even of a SIGKILL
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env=None if env is None else dict(env),
    )
    talk = asyncio.ensure_future(proc.communicate())
    rc = await wait_or_kill(proc, timeout_s, first=talk)
    out, err = talk.result() if rc is not None else (b"", b"")
    return Completed(rc, out, err, time.monotonic() - t0)


async def wait_or_kill(
    proc: asyncio.subprocess.Process, timeout_s: float, first: Awaitable[Any] | None = None
) -> int | None:
    """Wait for ``proc`` to exit (after ``first``, say its output read to the end) for at most
    ``timeout_s``. Past it, or when cancelled, its process group is killed and reaped (the kill
    bounded too) before this returns None or lets the cancellation through: every bounded
    subprocess the watchdog starts (py-spy, an operator's command) ends this way."""

    async def exited() -> int:
        if first is not None:
            await first
        return await proc.wait()

    try:
        return await asyncio.wait_for(exited(), max(timeout_s, 0.001))
    except asyncio.TimeoutError:
        return None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(proc.wait(), _KILL_WAIT_S)


def write_private(path: Path, data: bytes) -> None:
    """Create ``path`` (0600; its folder 0700 if missing) and write ``data``; never overwrites.

    Only the last folder level is created: a write that comes after its bundle directory was
    removed (an aborted bundle) fails instead of re-creating it. OSError (ENOSPC included)
    propagates: the bundle writer turns it into a clean abort.
    """
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        # The data must reach the disk now: a full disk found at close() would escape us.
        os.fsync(f.fileno())


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and every missing parent 0700 (``mkdir -p`` gives parents the umask's
    mode). Folders that exist are left as their owner made them."""
    missing: list[Path] = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


def copy_private(src: Path, dest: Path) -> None:
    """Copy into the bundle as a private file (0600), never over an existing one."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with src.open("rb") as fin, os.fdopen(fd, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
