"""Native stacks of a process that is not Python (llama.cpp's llama-server is one), with the real
eu-stack: a C process whose worker thread is blocked on a mutex its main thread holds.

py-spy cannot read such a process; the native-stacks step does, the py-spy step leaves it alone,
and summary.md names where each thread waits from the native frames.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_watchdog.capture.bundle import BundleSettings, write_bundle
from engine_watchdog.capture.native import FIX_MISSING, native_step
from engine_watchdog.capture.pyspy import NO_PYTHON, pyspy_step
from engine_watchdog.capture.step import CaptureContext
from engine_watchdog.capture.steps import capture_steps
from engine_watchdog.core.settings import CaptureSettings
from engine_watchdog.host.tools import resolve_tools
from engine_watchdog.probes.procs import sample_procs

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
EU_STACK = resolve_tools().get("eu-stack")
BLOCKED = 'thread "stuck-worker" blocked acquiring a lock in native_engine_step_blocked'

pytestmark = pytest.mark.skipif(
    EU_STACK is None, reason="eu-stack not installed (deploy/ensure-tools.sh installs elfutils)"
)


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("native") / "blocked_native"
    subprocess.run(
        [cc, "-O1", "-o", str(out), str(DATA / "blocked_native.c"), "-lpthread"],
        check=True,
        timeout=60,
    )
    return out


@contextlib.contextmanager
def started(binary: Path) -> Iterator[int]:
    proc = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        _settled(proc.pid)
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _settled(pid: int, timeout: float = 10.0) -> None:
    """Both threads asleep: the worker blocked on the mutex, main in pause()."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        if len(tasks) == 2 and all(state(pid, int(t.name)) == "S" for t in tasks):
            return
        time.sleep(0.01)
    raise AssertionError(f"PID {pid}'s threads never both slept")


def ctx(tmp_path: Path, pid: int, tools: dict[str, str] | None = None) -> CaptureContext:
    procs = sample_procs(pids=[pid]).procs
    tools = {"eu-stack": EU_STACK or ""} if tools is None else tools
    return CaptureContext(tmp_path, procs, timeout_s=10.0, tools=tools)


def state(pid: int, tid: int | None = None) -> str:
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


async def test_native_stacks_of_a_blocked_thread(binary: Path, tmp_path: Path) -> None:
    with started(binary) as pid:
        res = await native_step()(ctx(tmp_path, pid))
        assert res.status == "ok", res
        assert res.files == (f"native/{pid}.json", f"native/{pid}.txt")
        threads = json.loads((tmp_path / f"native/{pid}.json").read_text())
        names = {t["thread_name"] for t in threads}
        assert names == {"blocked_native", "stuck-worker"}, names
        frames = [f["name"] for t in threads for f in t["frames"]]
        assert "native_engine_step_blocked" in frames
        assert not any("@" in f for f in frames)  # symbol versions stripped
        assert state(pid) == "S"  # detached: running on


async def test_a_stopped_process_is_read_and_left_stopped(binary: Path, tmp_path: Path) -> None:
    with started(binary) as pid:
        os.kill(pid, signal.SIGSTOP)
        res = await native_step()(ctx(tmp_path, pid))
        assert res.status == "ok", res
        assert state(pid) == "T"


async def test_py_spy_leaves_a_native_process_to_the_native_step(
    binary: Path, tmp_path: Path
) -> None:
    with started(binary) as pid:
        res = await pyspy_step()(ctx(tmp_path, pid, {"py-spy": shutil.which("true") or ""}))
        assert (res.status, res.detail) == ("not-available", NO_PYTHON)


async def test_without_eu_stack_the_step_names_the_fix(binary: Path, tmp_path: Path) -> None:
    with started(binary) as pid:
        res = await native_step()(ctx(tmp_path, pid, {}))
        assert (res.status, res.detail) == ("not-available", FIX_MISSING)


async def test_summary_names_where_each_native_thread_waits(binary: Path, tmp_path: Path) -> None:
    with started(binary) as pid:
        settings = BundleSettings(
            capture=CaptureSettings(incident_dir=tmp_path / "incidents"),
            engine="llamacpp",
            tools={"eu-stack": EU_STACK or ""},
        )
        procs = sample_procs(pids=[pid]).procs
        res = await write_bundle(settings, None, procs, [], capture_steps(destructive=False))
        summary = (res.path / "summary.md").read_text()
    assert f"- PID {pid} {BLOCKED}" in summary or BLOCKED in summary, summary
    assert "; native stacks, eu-stack)" in summary, summary
