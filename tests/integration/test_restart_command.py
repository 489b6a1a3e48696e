"""``--restart-command`` with real commands: the watchdog waits for the
command itself, never for what it started, and never kills what it deliberately detached."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine_watchdog.core.model import Result
from engine_watchdog.recovery.restart import run_restart_command
from engine_watchdog.sim.launcher import free_port
from tests.tools.watch import get
from tests.waiting import eventually


@pytest.fixture
def left_running() -> Iterator[list[int]]:
    """PIDs (of process groups) a test leaves running; killed afterwards, pass or fail."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if pid > 1 and pid != os.getpgrp():  # never our own group, never "every process"
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def pid_in(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_command_that_backgrounds_its_engine_succeeds_and_the_engine_serves(
    tmp_path: Path, left_running: list[int]
) -> None:
    port, pidfile = free_port(), tmp_path / "engine.pid"
    sim = f"{sys.executable} -m engine_watchdog.sim --port {port}"
    # The engine inherits the command's stdout: waiting for that to close waits for the engine.
    command = ["sh", "-c", f"{sim} & echo $! > {pidfile}; echo started"]
    started = time.monotonic()
    done = await run_restart_command(command, 8.0, tmp_path / "restart-command.log")
    engine = pid_in(pidfile)
    if engine is not None:
        left_running.append(os.getpgid(engine))
    assert done.result == Result.OK, done
    assert time.monotonic() - started < 5
    await eventually(lambda: _healthy(port), 30, 0.2, what="the backgrounded engine serving")
    assert "started" in (tmp_path / "restart-command.log").read_text()


async def _healthy(port: int) -> bool:
    with contextlib.suppress(OSError, TimeoutError):
        return (await get(f"http://127.0.0.1:{port}/health"))[0] == 200
    return False


async def test_a_setsid_command_is_waited_for_and_its_detached_child_lives(
    tmp_path: Path, left_running: list[int]
) -> None:
    """setsid(1) forks when it leads a process group (as the command does): the parent exits at
    once and the child runs on in a session of its own, holding the command's stdout."""
    pidfile = tmp_path / "detached.pid"
    command = ["setsid", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"]
    done = await run_restart_command(command, 3.0, tmp_path / "restart-command.log")
    pid = await eventually(lambda: pid_in(pidfile), 5, what="the detached child's PID")
    left_running.append(pid)
    assert done.result == Result.OK, done
    assert alive(pid)


async def test_a_command_past_its_timeout_is_killed_but_not_what_it_detached(
    tmp_path: Path, left_running: list[int]
) -> None:
    pidfile = tmp_path / "detached.pid"
    command = ["sh", "-c", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' & exec sleep 30"]
    done = await run_restart_command(command, 1.0, tmp_path / "restart-command.log")
    pid = await eventually(lambda: pid_in(pidfile), 5, what="the detached child's PID")
    left_running.append(pid)
    assert done.result == Result.FAILED and "ran past 1 s" in done.detail, done
    assert alive(pid)


async def test_a_failing_command_says_its_exit_code_and_last_line(tmp_path: Path) -> None:
    command = ["sh", "-c", "echo working; echo 'unit vllm.service not found' >&2; exit 5"]
    done = await run_restart_command(command, 5.0, tmp_path / "restart-command.log")
    assert done.result == Result.FAILED
    assert "exited 5" in done.detail and "unit vllm.service not found" in done.detail, done
