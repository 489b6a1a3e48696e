"""recovery/node_clean.py against real processes of three kinds, after the engine's main
process was killed: its worker that survived (reparented, stopped, holding a GPU and a shared
memory segment) is ended and its segment removed; a process of another UID in the engine's own
session, and a process of the engine's UID outside its tree and sessions (holding a GPU and a
segment of its own), are left alone, each with its reason. NVML is a fake (no GPU here)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine_watchdog.host.proclist import PsutilProcesses
from engine_watchdog.recovery.node_clean import EngineRef, clean_node
from tests.tools.fake_nvml import FakeNvml
from tests.waiting import eventually

ENGINE_UID, OTHER_UID = 1000, 1001
PYTHON = "/usr/bin/python3"
NOT_HERE = 4_000_000  # above pid_max: a PID NVML may report from another PID namespace
HOLD = (
    "import mmap, os, sys, time\n"
    "def hold(path):\n"
    "    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)\n"
    "    os.ftruncate(fd, 4096)\n"
    "    return mmap.mmap(fd, 4096)\n"
)
ENGINE = HOLD + (
    "kid = os.fork()\n"
    "if kid == 0:\n"
    "    if os.fork() == 0:  # the worker: its parent exits, it is reparented\n"
    "        m = hold(sys.argv[1] + '/nccl-worker')\n"
    "        os.write(1, b'worker %d\\n' % os.getpid())\n"
    "        time.sleep(600)\n"
    "    os._exit(0)\n"
    "os.waitpid(kid, 0)\n"
    "os.write(1, b'reaped %d\\n' % kid)\n"
    "time.sleep(600)\n"
)
OUTSIDER = HOLD + "m = hold(sys.argv[1] + '/nccl-outsider')\nprint('ready', flush=True)\n"
OUTSIDER += "time.sleep(600)\n"
LAUNCHER = (
    "import os, subprocess, sys, time\n"
    "as_uid = lambda uid: ['setpriv', f'--reuid={uid}', f'--regid={uid}', '--clear-groups']\n"
    "engine = subprocess.Popen(as_uid(1000) + sys.argv[1:], stdout=sys.stdout)\n"
    "other = subprocess.Popen(as_uid(1001) + ['sleep', '600'])\n"
    "os.write(1, b'engine %d other %d\\n' % (engine.pid, other.pid))\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.2)\n"
)
"""The engine's launcher (root, its own session): starts the engine as UID 1000 and, in the
same session, a process of UID 1001; it reaps its children."""


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="engine-watchdog-shm-"))
    os.chown(path, ENGINE_UID, ENGINE_UID)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def started(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def words(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    return proc.stdout.readline().split()  # bounded: pytest's timeout, the scripts print first


def pairs(said: list[str]) -> dict[str, str]:
    """``["engine", "12", "worker", "13"]`` -> ``{"engine": "12", "worker": "13"}``."""
    return dict(zip(said[::2], said[1::2], strict=True))


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class LiveNvml(FakeNvml):
    """The holders still running, as the driver lists them (a process that exited, a zombie
    too, holds no context); PIDs of another PID namespace (never seen here) always listed."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(pids)
        self.phantoms = {pid for pid in pids if not psutil.pid_exists(pid)}

    def listed(self) -> list[int]:
        return [pid for pid in self.pids if pid in self.phantoms or _holds(pid)]


def _holds(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_only_the_engines_leftovers_are_ended(shm_dir: Path) -> None:
    engine_argv = [PYTHON, "-c", ENGINE, str(shm_dir)]
    outsider_argv = ["setpriv", f"--reuid={ENGINE_UID}", f"--regid={ENGINE_UID}", "--clear-groups"]
    with (
        started([PYTHON, "-c", LAUNCHER, *engine_argv]) as launcher,
        started([*outsider_argv, PYTHON, "-c", OUTSIDER, str(shm_dir)]) as outsider,
    ):
        # The lines in any order, each one write (print's pieces, unbuffered, interleaved). The
        # engine's middle child reaped first: killed with it still a zombie, the engine left it
        # to init, and the report named it (CI: init was slow to reap).
        said = pairs(words(launcher) + words(launcher) + words(launcher))
        engine_pid, other_pid, worker_pid = said["engine"], said["other"], said["worker"]
        assert words(outsider) == ["ready"]
        procs = PsutilProcesses()
        table = procs.processes()
        engine = EngineRef(
            ENGINE_UID,
            (table[launcher.pid], table[int(engine_pid)]),
            frozenset({table[launcher.pid].sid}),
        )
        worker, other = psutil.Process(int(worker_pid)), psutil.Process(int(other_pid))
        worker.send_signal(signal.SIGSTOP)  # stopped: a SIGTERM alone would wait for a SIGCONT
        os.kill(int(engine_pid), signal.SIGKILL)  # the group's stop: the main process only
        await eventually(lambda: not psutil.pid_exists(int(engine_pid)), 10, what="engine gone")
        gpu = [worker.pid, outsider.pid, other.pid, NOT_HERE]

        report = clean_node(engine, procs, LiveNvml(gpu), shm_dir, grace_s=5.0)

        assert not running(worker), "the engine's worker survived"  # a zombie until init reaps it
        assert running(other) and running(psutil.Process(outsider.pid))
        assert [(i.kind, i.pid) for i in report.removed] == [
            ("gpu-process", worker.pid),
            ("shm", None),
        ], report
        assert report.removed[1].what == str(shm_dir / "nccl-worker")
        left = {i.pid or i.what: i.reason for i in report.left}
        assert left == {
            outsider.pid: "the engine's UID, but outside its process tree and sessions",
            other.pid: f"UID {OTHER_UID}, not the engine's ({ENGINE_UID})",
            NOT_HERE: "not visible in this node's PID namespace",
            str(shm_dir / "nccl-outsider"): f"in use by PID {outsider.pid}",
        }, report
        assert report.clean and sorted(os.listdir(shm_dir)) == ["nccl-outsider"]
