"""The py-spy step's decisions, driven by a fake py-spy (tests/data/capture/fake_pyspy.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.capture.pyspy import (
    FIX_MISSING,
    PySpyOptions,
    classify_error,
    pyspy_step,
    read_state_letter,
    render_text,
)
from engine_watchdog.capture.step import CaptureContext, StepResult
from engine_watchdog.core.model import ProcInfo

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
PERMISSION = "Permission Denied: Try running again with elevated permissions by going 'sudo env'\n"
SUSPEND = "Error: Failed to get stack traces\n\nCaused by:\n    0: Failed to suspend process\n"
GONE = "Error: Failed to get process executable name. Check that the process is running.\n"
STACKS = (DATA / "pyspy_lock_native.json").read_text()


NATIVE_S = 5.0
"""A native dump's timeout where the fake must have started before it is killed."""


def make_fake(tmp_path: Path, spec: dict[str, Any]) -> str:
    """A fake py-spy executable in its own folder, behaving as ``spec`` says."""
    folder = tmp_path / "fake"
    folder.mkdir(parents=True)
    exe = folder / "py-spy"
    exe.write_text(f"#!{sys.executable}\n" + (DATA / "fake_pyspy.py").read_text())
    exe.chmod(0o755)
    (folder / "fake_pyspy.json").write_text(json.dumps(spec))
    return str(exe)


def calls(exe: str) -> list[str]:
    log = Path(exe).parent / "calls.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def proc(pid: int, state: str = "sleeping") -> ProcInfo:
    return ProcInfo(
        pid=pid, ppid=1, role="engine-core", title="VLLM::EngineCore", state=state, cpu_s=1.0
    )


def ctx(tmp_path: Path, exe: str | None, *procs: ProcInfo, timeout: float = 20.0) -> CaptureContext:
    work = tmp_path / "bundle"
    work.mkdir(parents=True, exist_ok=True)
    return CaptureContext(
        workdir=work, procs=procs, timeout_s=timeout, tools={"py-spy": exe} if exe else {}
    )


def fake_stat(root: Path, pid: int, state: str) -> Path:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    path = root / str(pid) / "stat"
    path.write_text(f"{pid} (VLLM::Engine Core)) {state} 1 {pid} {pid} 0 -1\n")
    return path


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A real, harmless process (signals sent to it by the step must not hurt anyone)."""
    p = subprocess.Popen(["sleep", "120"], start_new_session=True)
    yield p.pid
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(10)


async def test_native_ok_writes_json_and_text(tmp_path: Path) -> None:
    exe = make_fake(tmp_path, {"native": {"stdout": STACKS}})
    res = await pyspy_step(proc_root=tmp_path / "proc")(ctx(tmp_path, exe, proc(4242)))
    assert res.status == "ok" and res.name == "py-spy"
    assert res.files == ("pyspy/4242.json", "pyspy/4242.txt")
    text = (tmp_path / "bundle" / "pyspy/4242.txt").read_text()
    assert "engine_step_blocked_on_lock (blocked_target.py:15)" in text
    assert calls(exe) == ["native"]


async def test_native_timeout_falls_back_to_plain_and_kills(tmp_path: Path) -> None:
    exe = make_fake(tmp_path, {"native": {"sleep": 60}, "plain": {"stdout": STACKS}})
    # Long enough for the fake (two interpreters: the wrapper, then the fake) to start and log
    # itself on a loaded machine: with 0.5 s, CI could kill it before.
    opts = PySpyOptions(native_timeout_s=NATIVE_S)
    t0 = time.monotonic()
    res = await pyspy_step(opts, tmp_path / "proc")(ctx(tmp_path, exe, proc(4242)))
    assert time.monotonic() - t0 < NATIVE_S + 10
    assert res.status == "ok" and "native timed out" in res.detail and "plain dump" in res.detail
    log = (Path(exe).parent / "calls.log").read_text().split()
    native_pid = int(log[1])
    with pytest.raises(ProcessLookupError):
        os.kill(native_pid, 0)  # the timed-out native dump was killed, not left behind


async def test_stopped_process_gets_nonblocking_only(tmp_path: Path) -> None:
    fake_stat(tmp_path / "proc", 4242, "T")
    exe = make_fake(tmp_path, {"nonblocking": {"stdout": STACKS}})
    res = await pyspy_step(proc_root=tmp_path / "proc")(ctx(tmp_path, exe, proc(4242, "stopped")))
    assert res.status == "ok" and calls(exe) == ["nonblocking"]


async def test_suspend_failure_retries_nonblocking(tmp_path: Path) -> None:
    exe = make_fake(
        tmp_path, {"native": {"rc": 1, "stderr": SUSPEND}, "nonblocking": {"stdout": STACKS}}
    )
    res = await pyspy_step(proc_root=tmp_path / "proc")(ctx(tmp_path, exe, proc(4242)))
    assert res.status == "ok" and calls(exe) == ["native", "nonblocking"]


async def test_permission_denied_names_the_fix(tmp_path: Path) -> None:
    exe = make_fake(tmp_path, {m: {"rc": 1, "stderr": PERMISSION} for m in ("native", "plain")})
    res = await pyspy_step(proc_root=tmp_path / "proc")(ctx(tmp_path, exe, proc(4242)))
    assert res.status == "permission-denied"
    assert "SYS_PTRACE" in res.detail and "shareProcessNamespace" in res.detail
    assert "ptrace_scope" in res.detail and "UID" in res.detail
    assert calls(exe) == ["native"]  # plain would be refused the same way
    assert res.files == ("pyspy/4242.err",)


async def test_missing_pyspy_is_not_available(tmp_path: Path) -> None:
    res = await pyspy_step()(ctx(tmp_path, None, proc(4242)))
    assert (res.status, res.detail) == ("not-available", FIX_MISSING)
    assert "pip install py-spy" in res.detail
    res = await pyspy_step()(ctx(tmp_path, str(tmp_path / "nope"), proc(4242)))
    assert res.status == "not-available"


async def test_one_failure_among_several_is_partial(tmp_path: Path) -> None:
    exe = make_fake(
        tmp_path, {"native": {"stdout": STACKS}, "native:4243": {"rc": 1, "stderr": PERMISSION}}
    )
    res = await pyspy_step(proc_root=tmp_path / "proc")(
        ctx(tmp_path, exe, proc(4242), proc(4243), proc(4244, "gone"))
    )
    assert res.status == "partial"
    assert "4243: permission-denied" in res.detail and "4244" not in res.detail


async def test_unreadable_json_is_partial(tmp_path: Path) -> None:
    exe = make_fake(tmp_path, {"native": {"stdout": "not json"}})
    res = await pyspy_step(proc_root=tmp_path / "proc")(ctx(tmp_path, exe, proc(7)))
    assert res.status == "partial" and res.files == ("pyspy/7.txt",)


async def test_whole_step_bounded_by_context_timeout(tmp_path: Path) -> None:
    exe = make_fake(tmp_path, {m: {"sleep": 60} for m in ("native", "plain")})
    t0 = time.monotonic()
    res = await pyspy_step(PySpyOptions(native_timeout_s=1.0, margin_s=0.5), tmp_path / "proc")(
        ctx(tmp_path, exe, proc(4242), timeout=3.0)
    )
    assert res.status == "timeout" and time.monotonic() - t0 < 8


async def test_process_left_stopped_by_killed_dump_is_continued(
    tmp_path: Path, sleeper: int
) -> None:
    stat = fake_stat(tmp_path / "proc", sleeper, "S")
    # The "native dump" stops the target (as a ptrace attach can) and then hangs.
    exe = make_fake(
        tmp_path,
        {
            "native": {
                "sleep": 60,
                "write_stat": [str(stat), stat.read_text().replace(" S ", " T ")],
            },
            "plain": {"stdout": STACKS},
        },
    )
    # (CI killed the fake before it had stopped anything with 1 s: NATIVE_S, as above.)
    res = await pyspy_step(PySpyOptions(native_timeout_s=NATIVE_S), tmp_path / "proc")(
        ctx(tmp_path, exe, proc(sleeper))
    )
    assert f"PID {sleeper} was left stopped by the killed dump: sent SIGCONT" in res.detail


@pytest.mark.parametrize(
    ("stderr", "status"),
    [
        (PERMISSION, "permission-denied"),
        ("Operation not permitted (os error 1)", "permission-denied"),
        (SUSPEND, None),
        (GONE, "not-available"),
        ("Error: Failed to find python version", "failed"),
    ],
)
def test_classify_error(stderr: str, status: str | None) -> None:
    assert classify_error(stderr) == status


def test_state_letter_survives_parens_in_name(tmp_path: Path) -> None:
    fake_stat(tmp_path, 9, "t")
    assert read_state_letter(9, tmp_path) == "t"
    assert read_state_letter(10, tmp_path) is None


def test_render_text_matches_pyspy_layout() -> None:
    text = render_text(proc(1), "native", json.loads(STACKS))
    assert text.startswith("Process 1: VLLM::EngineCore\n")
    assert 'Thread 12949 (idle): "stuck-worker"' in text
    assert "    PyThread_acquire_lock_timed (libpython3.11.so.1.0)" in text


def test_fake_is_not_on_path() -> None:
    # The fakes live in temp folders only; the real py-spy is the one the product finds.
    assert shutil.which("py-spy") != str(DATA / "fake_pyspy.py")


async def test_cancelled_step_kills_its_pyspy(tmp_path: Path) -> None:
    exe = make_fake(tmp_path, {"native": {"sleep": 60}})
    step = pyspy_step(proc_root=tmp_path / "proc")
    task: asyncio.Future[StepResult] = asyncio.ensure_future(step(ctx(tmp_path, exe, proc(4242))))
    log = Path(exe).parent / "calls.log"
    for _ in range(400):  # the fake py-spy has started once it logged its call
        if log.exists():
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(int(log.read_text().split()[1]), 0)
