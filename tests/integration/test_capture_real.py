"""Capture against real processes with the real py-spy: a thread blocked on a lock, a stopped
process, discovery from a listening port, ptrace refused, py-spy missing, a disk that fills."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest

from engine_watchdog.capture.bundle import BundleError, BundleSettings, write_bundle
from engine_watchdog.capture.pyspy import pyspy_step
from engine_watchdog.capture.step import CaptureContext, StepResult
from engine_watchdog.core.settings import CaptureSettings
from engine_watchdog.host.tools import resolve_tools, write_private
from engine_watchdog.probes.pidns import read_ns_pid
from engine_watchdog.probes.procs import sample_procs
from tests.tools.cli import run_cli_sync
from tests.waiting import eventually

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
START_TIMEOUT_S = 60.0
BLOCKED = 'thread "stuck-worker" blocked acquiring a lock in engine_step_blocked_on_lock'

pytestmark = pytest.mark.skipif(not resolve_tools().get("py-spy"), reason="py-spy not installed")


@dataclass
class Started:
    proc: subprocess.Popen[str]
    first_line: str

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextlib.contextmanager
def start(script: str, *args: str) -> Iterator[Started]:
    """Run a test script in its own process group; kill the group whatever happens."""
    proc = subprocess.Popen(
        [sys.executable, str(DATA / script), *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = _readline(proc, START_TIMEOUT_S)
        yield Started(proc, line)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"{proc.args!r} printed nothing within {timeout} s")
    return proc.stdout.readline().strip()


@pytest.fixture
def target() -> Iterator[Started]:
    with start("blocked_target.py", "300") as s:
        assert s.first_line == "ready"
        yield s


@pytest.fixture
def engine() -> Iterator[Started]:
    with start("fake_engine.py", "300") as s:
        yield s


def settings(tmp_path: Path, **kw: object) -> BundleSettings:
    return BundleSettings(CaptureSettings(incident_dir=tmp_path / "inc"), **kw)  # type: ignore[arg-type]


async def test_bundle_shows_the_thread_blocked_on_a_lock(tmp_path: Path, target: Started) -> None:
    procs = sample_procs(pids=[target.pid]).procs
    res = await write_bundle(settings(tmp_path), None, procs, [], [pyspy_step()])
    assert [(s.name, s.status) for s in res.steps] == [("py-spy", "ok")]
    assert "native dump" in res.steps[0].detail
    stacks = json.loads((res.path / "pyspy" / f"{target.pid}.json").read_text())
    names = [f["name"] for th in stacks for f in th["frames"]]
    assert "engine_step_blocked_on_lock" in names and "PyThread_acquire_lock_timed" in names
    assert (
        "engine_step_blocked_on_lock (blocked_target.py:"
        in (res.path / "pyspy" / f"{target.pid}.txt").read_text()
    )
    assert BLOCKED in (res.path / "summary.md").read_text()
    assert res.elapsed_s < 20


async def test_stopped_process_is_dumped_nonblocking(tmp_path: Path, target: Started) -> None:
    os.kill(target.pid, signal.SIGSTOP)
    try:
        # The kernel stops the process asynchronously: under load it can still read 'running'
        # for a moment after kill() returns. Wait for state T before capturing.
        await eventually(
            lambda: psutil.Process(target.pid).status() == psutil.STATUS_STOPPED,
            timeout=30,
            what="the target in state T",
        )
        procs = sample_procs(pids=[target.pid]).procs
        assert procs[0].state == "stopped"
        res = await write_bundle(settings(tmp_path), None, procs, [], [pyspy_step()])
        assert res.steps[0].status == "ok" and "nonblocking dump" in res.steps[0].detail
        summary = (res.path / "summary.md").read_text()
        assert f"PID {target.pid} is stopped" in summary
        assert "blocked acquiring a lock in engine_step_blocked_on_lock (`LOCK.acquire()`)" in (
            summary
        )
        # Capture observes; resuming an operator's SIGSTOP is not its call.
        assert sample_procs(pids=[target.pid]).procs[0].state == "stopped"
    finally:
        os.kill(target.pid, signal.SIGCONT)


def test_discovery_from_the_listening_port(engine: Started) -> None:
    obs = sample_procs(f"http://127.0.0.1:{engine.first_line}")
    roles = {p.role: p for p in obs.procs}
    assert set(roles) == {"engine-core", "api-server"}
    assert roles["engine-core"].title == "VLLM::EngineCore"
    assert roles["engine-core"].ppid == roles["api-server"].pid == engine.pid
    assert read_ns_pid(engine.pid) is None


def test_cli_capture_by_url_finds_the_engine_core(tmp_path: Path, engine: Started) -> None:
    url = f"http://127.0.0.1:{engine.first_line}"
    ran = run_cli_sync("capture", "--url", url, "--incident-dir", str(tmp_path), "--tar")
    assert ran.code == 0, ran
    path = Path(ran.out.strip().splitlines()[0])
    assert path.name.endswith("-vllm-manual.tar.gz") and path.exists()
    ran = run_cli_sync("capture", "--url", url, "--incident-dir", str(tmp_path), "--json")
    doc = json.loads(ran.out)
    summary = (Path(doc["path"]) / "summary.md").read_text()
    assert f"EngineCore {BLOCKED}" in summary
    assert doc["steps"][0]["status"] == "ok"


def test_doctor_sees_the_engine(engine: Started) -> None:
    url = f"http://127.0.0.1:{engine.first_line}"
    ran = run_cli_sync("doctor", "--url", url, "--json")
    checks = {c["name"]: c for c in json.loads(ran.out)["checks"]}
    assert checks["ptrace"]["status"] == "ok"
    assert checks["py-spy trial"]["status"] == "ok"
    assert checks["engine processes"]["status"] == "ok"
    assert checks["nvml"]["status"] in ("ok", "optional")
    assert ran.code == 0


def unprivileged_pyspy(tmp_path: Path) -> str:
    """The real py-spy, run as nobody: the kernel refuses its ptrace of a root process."""
    wrapper = tmp_path / "py-spy-as-nobody"
    real = resolve_tools()["py-spy"]
    wrapper.write_text(
        f"#!{sys.executable}\nimport os, sys\nos.setgid(65534)\nos.setgroups([])\n"
        f"os.setuid(65534)\nos.execv({real!r}, [{real!r}] + sys.argv[1:])\n"
    )
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")
def test_ptrace_refused_names_the_fix(tmp_path: Path, target: Started) -> None:
    py_spy = unprivileged_pyspy(tmp_path)
    ran = run_cli_sync(
        "capture",
        "--pid",
        str(target.pid),
        "--incident-dir",
        str(tmp_path / "inc"),
        "--py-spy",
        py_spy,
    )
    assert ran.code == 0, ran
    assert "warning: py-spy permission-denied" in ran.err
    assert "CAP_SYS_PTRACE" in ran.err and "shareProcessNamespace" in ran.err
    path = Path(ran.out.splitlines()[0])
    step = json.loads((path / "manifest.json").read_text())["steps"][0]
    assert step["status"] == "permission-denied"
    assert "Permission Denied" in (path / "pyspy" / f"{target.pid}.err").read_text()


def test_missing_pyspy_is_reported(tmp_path: Path, target: Started) -> None:
    ran = run_cli_sync(
        "capture",
        "--pid",
        str(target.pid),
        "--incident-dir",
        str(tmp_path),
        "--py-spy",
        "/nonexistent/py-spy",
    )
    assert ran.code == 0
    assert "warning: py-spy not-available: py-spy is not installed: pip install py-spy" in (ran.err)
    path = Path(ran.out.splitlines()[0])
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["steps"][0]["status"] == "not-available"
    assert "No stacks were captured" in (path / "summary.md").read_text()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (needs root and mount rights; skipped otherwise)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30, check=False)


async def test_disk_that_fills_leaves_no_partial_bundle(
    small_disk: Path, tmp_path: Path, target: Started
) -> None:
    async def big_step(ctx: CaptureContext) -> StepResult:
        write_private(ctx.workdir / "big.bin", b"x" * 40_000)
        return StepResult("big", "ok", ("big.bin",))

    log = tmp_path / "engine.log"
    log.write_bytes(b"log line\n" * 10_000)  # 90 KB: the tail no longer fits
    procs = sample_procs(pids=[target.pid]).procs
    s = BundleSettings(CaptureSettings(incident_dir=small_disk / "inc", engine_log=log))
    with pytest.raises(BundleError, match="no space left"):
        await write_bundle(s, None, procs, [], [pyspy_step(), big_step])
    assert list((small_disk / "inc").iterdir()) == []
    # Without the oversized parts, a capture fits on the same volume: nothing was left behind.
    res = await write_bundle(
        BundleSettings(CaptureSettings(incident_dir=small_disk / "inc")),
        None,
        procs,
        [],
        [pyspy_step()],
    )
    assert res.path.parent == small_disk / "inc" and res.steps[0].status == "ok"


async def test_a_destructive_step_leaves_the_engine_s_records_and_masking(tmp_path: Path) -> None:
    """The CUDA core dump ends the engine it dumps (seen on an H200: the bundle then held no
    command line or environment for the engine core, and its log's masking knew none of its
    secrets). The records are read before the steps run."""
    secret = "sk-destructive-0123456789abcdef"
    with start("fake_engine.py", "300", "--api-key", secret) as victim:

        async def ends_it(ctx: CaptureContext) -> StepResult:  # what cuda-coredump does to it
            os.kill(victim.pid, signal.SIGKILL)
            victim.proc.wait(10)
            return StepResult("ends-it", "ok", ())

        log = tmp_path / "engine.log"
        log.write_text(f"INFO started with --api-key {secret}\n")
        procs = sample_procs(pids=[victim.pid]).procs
        s = BundleSettings(CaptureSettings(incident_dir=tmp_path / "inc", engine_log=log))
        res = await write_bundle(replace(s, destructive=True), None, procs, [], [ends_it])
    records = json.loads((res.path / "processes.json").read_text())
    (record,) = [r for r in records if r["pid"] == victim.pid]
    assert "cmdline_error" not in record, record
    assert "--api-key" in record["cmdline"] and secret not in json.dumps(record)
    logged = (res.path / "engine.log").read_text()
    assert "--api-key" in logged and secret not in logged, logged
