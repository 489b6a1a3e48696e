"""A restart kills only the watched engine's processes, with real processes:
two simulated engines under one shell, PID 1, an engine of another UID (tests run as root),
an orphaned engine core. A ``--pid`` that is not an engine, or is another user's, is refused at
start in one line (exit 64)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine_watchdog.sim.launcher import free_port
from tests.tools.cli import CONSOLE_SCRIPT, run_cli
from tests.tools.run_mode import Watchdogs, history, keep_asking, listeners
from tests.tools.watch import get
from tests.waiting import eventually

SIM = [sys.executable, "-m", "engine_watchdog.sim"]
STALL = ("--stall-seconds", "4", "--startup-grace", "0", "--canary-timeout", "2")
NOBODY = 65534
ORPHAN = "import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(120)"


async def healthy(port: int) -> bool:
    with contextlib.suppress(OSError, TimeoutError):
        return (await get(f"http://127.0.0.1:{port}/health"))[0] == 200
    return False


def core_of(port: int) -> psutil.Process:
    """The engine core of the simulator serving ``port``."""
    (server,) = listeners(port)
    cores = [c for c in psutil.Process(server).children() if "EngineCore" in " ".join(c.cmdline())]
    assert len(cores) == 1, cores
    return cores[0]


def restart_records(incident_dir: Path) -> list[dict[str, Any]]:
    return [r for r in history(incident_dir) if r["action"] == "restart"]


def alive(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


def spawn_group(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # fixed argv
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


async def start_group(argv: list[str], ports: list[int]) -> subprocess.Popen[bytes]:
    """``argv`` in a process group of its own, once a simulator answers on every port."""
    proc = spawn_group(argv)
    try:
        for port in ports:
            await eventually(partial(healthy, port), 30, 0.2, what=f"a simulator on {port}")
    except BaseException:
        end_group(proc)
        raise
    return proc


def end_group(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
    proc.wait(timeout=10)


@pytest.fixture
async def two_engines() -> AsyncIterator[tuple[int, int, int]]:
    """A shell that started two simulators; A hangs at its first request. (shell PID, A, B)"""
    a, b = free_port(), free_port()
    sims = f"{' '.join(SIM)} --port {a} --fault spin & {' '.join(SIM)} --port {b} & wait"
    shell = await start_group(["sh", "-c", sims], [a, b])
    try:
        yield shell.pid, a, b
    finally:
        end_group(shell)


@pytest.fixture
def orphan() -> Iterator[psutil.Process]:
    """A process titled VLLM::EngineCore whose parent has gone (reparented to init)."""
    cmd = f'{sys.executable} -c "{ORPHAN}" >/dev/null 2>&1 & echo $!'
    ran = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=10, check=True)
    proc = psutil.Process(int(ran.stdout))
    try:
        yield proc
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


async def test_a_pid_holding_two_engines_is_refused_and_both_engines_live(
    tmp_path: Path, two_engines: tuple[int, int, int]
) -> None:
    shell, a, b = two_engines
    cores = core_of(a), core_of(b)
    async with Watchdogs(tmp_path) as dogs:
        client = asyncio.create_task(keep_asking(a))
        try:
            watch = await dogs.start(
                "watch", f"http://127.0.0.1:{a}", "--pid", str(shell), "--action", "restart",
                "--incident-dir", str(tmp_path), *STALL,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):  # before the fix it ran, and killed both
                await asyncio.wait_for(watch.proc.wait(), 30)
        finally:
            client.cancel()
        assert alive(cores[1]), "the healthy engine's core was killed"
        assert alive(cores[0])
        assert watch.proc.returncode == 64, watch.log()[-2000:]
        records = [json.loads(line) for line in watch.log().splitlines() if line.strip()]
        errors = [r["msg"] for r in records if r["logger"] == "engine_watchdog.cli"]  # --json
        assert len(errors) == 1, watch.log()
        assert f"--pid {shell} (sh -c" in errors[0] and "is not an engine process" in errors[0]
        assert "it runs 2 engines" in errors[0] and "leave --pid out" in errors[0]


def run_inside(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


async def test_pid_1_is_refused_where_it_is_init_and_taken_where_it_is_the_engine(
    tmp_path: Path,
) -> None:
    can = (
        run_inside(["unshare", "-pf", "--mount-proc", "true"]) if shutil.which("unshare") else None
    )
    if can is None or can.returncode != 0:
        pytest.skip(f"no PID namespace here (needs root): {can.stderr if can else 'no unshare'}")
    port = free_port()
    ns = await start_group(["unshare", "-pf", "--mount-proc", *SIM, "--port", str(port)], [port])
    try:
        url = f"http://127.0.0.1:{port}"
        ran = await run_cli("check", url, "--pid", "1", timeout=60)
        assert ran.code == 64, ran.err[-2000:]
        assert "--pid 1 (" in ran.err and "is not an engine process" in ran.err
        (engine,) = psutil.Process(ns.pid).children()  # PID 1 of its own namespace
        inside = ["nsenter", "-t", str(engine.pid), "-p", "-m", str(CONSOLE_SCRIPT)]
        done = await asyncio.to_thread(run_inside, [*inside, "check", url, "--pid", "1"])
        assert done.returncode == 0, done.stderr[-2000:]
        assert "(evidence: canary)" in done.stdout  # idle is no proof
    finally:
        end_group(ns)


@pytest.fixture
async def nobodys_engine() -> AsyncIterator[int]:
    """A simulator running as UID 65534 (it keeps only the capability to read the venv under
    /root); it hangs at its first request."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("running a process as another user needs root and setpriv(1)")
    port = free_port()
    setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
               "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]  # fmt: skip
    group = await start_group([*setpriv, *SIM, "--port", str(port), "--fault", "spin"], [port])
    try:
        yield port
    finally:
        end_group(group)


async def test_another_users_engine_is_refused_as_pid_and_spared_by_a_restart(
    tmp_path: Path, nobodys_engine: int
) -> None:
    port = nobodys_engine
    url, core = f"http://127.0.0.1:{port}", core_of(nobodys_engine)
    assert core.uids().real == NOBODY
    server = str(listeners(port)[0])
    ran = await run_cli("watch", url, "--pid", server, "--listen", "", timeout=60)
    assert ran.code == 64, ran.err[-2000:]
    assert f"belongs to UID {NOBODY}" in ran.err and f"--engine-uid {NOBODY}" in ran.err
    async with Watchdogs(tmp_path) as dogs:
        client = asyncio.create_task(keep_asking(port))
        try:
            watch = await dogs.start(
                "watch", url, "--action", "restart", "--incident-dir", str(tmp_path), *STALL
            )
            await watch.next_state("stalled", timeout=40)
            restarts = await eventually(lambda: restart_records(tmp_path), 30)
        finally:
            client.cancel()
        assert restarts[0]["result"] == "failed", restarts
        assert f"UID {NOBODY}, not 0" in restarts[0]["detail"]
        assert alive(core)
        told = await dogs.start("watch", url, "--pid", server, "--engine-uid", str(NOBODY))
        await told.next_state(None, timeout=30)  # told otherwise: taken, and judged


async def test_a_restart_kills_the_stalled_engine_only(
    tmp_path: Path, two_engines: tuple[int, int, int], orphan: psutil.Process
) -> None:
    """URL discovery: engine A's core is killed; engine B (beside it under one shell) and an
    orphaned engine core (another engine's, for all anyone can tell) are not."""
    _, a, b = two_engines
    cores = core_of(a), core_of(b)
    async with Watchdogs(tmp_path) as dogs:
        client = asyncio.create_task(keep_asking(a))
        try:
            watch = await dogs.start(
                "watch", f"http://127.0.0.1:{a}", "--action", "restart",
                "--incident-dir", str(tmp_path), *STALL,
            )  # fmt: skip
            await watch.next_state("stalled", timeout=40)
            await eventually(lambda: not alive(cores[0]), 30, what="engine A's core killed")
        finally:
            client.cancel()
        # The record is written when the rung ends, after the kill (seen late under load).
        await eventually(lambda: restart_records(tmp_path), 30, what="the restart record")
        assert alive(cores[1]), "the healthy engine's core was killed"
        assert alive(orphan), "an orphaned engine core outside the engine's tree was killed"
        (restart,) = restart_records(tmp_path)
        assert restart["result"] == "ok" and f"spared {orphan.pid}" in restart["detail"], restart
