"""The watchdog killed with SIGKILL, then started again, through the real console script:
nothing it started runs on unsupervised, nothing it half wrote stays.

- supervise mode: exactly one engine serves afterwards (no second engine failing on the port),
  whether the orphan still served or was stopped (SIGSTOP: hung) when its watchdog died;
- mid-capture (a py-spy that hangs): the py-spy dies with the watchdog, and the next watchdog
  removes the capture's temporary directory at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import psutil
import pytest

from engine_watchdog.sim.launcher import free_port
from tests.integration.conftest import SimFactory
from tests.tools.cli import run_cli
from tests.tools.run_mode import Watchdogs, keep_asking, kill_all, listeners, sim_engine, starts
from tests.waiting import eventually

FAKE_PYSPY = Path(__file__).resolve().parents[1] / "data" / "capture" / "fake_pyspy.py"


def gone(procs: list[psutil.Process]) -> bool:
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


@pytest.mark.parametrize("orphan", ["serving", "stopped"])
async def test_after_kill_9_of_run_exactly_one_engine_serves(tmp_path: Path, orphan: str) -> None:
    port, incidents = free_port(), tmp_path / "incidents"
    url = f"http://127.0.0.1:{port}"
    args = ("--incident-dir", str(incidents), "--", *sim_engine(tmp_path, port))
    async with Watchdogs(tmp_path) as dogs:
        first = await dogs.start("run", url, *args, name="first")
        await first.next_state("idle", timeout=40)
        old = dogs.remember(first)
        assert old and listeners(port) and set(listeners(port)) <= {p.pid for p in old}
        if orphan == "stopped":  # a hung engine: deaf to everything but SIGKILL and SIGCONT
            group = os.getpgid(old[0].pid)  # the engine's own (supervise mode starts a session)
            assert group not in (os.getpgrp(), first.proc.pid)
            os.killpg(group, signal.SIGSTOP)
        first.proc.send_signal(signal.SIGKILL)
        await first.proc.wait()
        second = await dogs.start("run", url, *args, name="second")
        await second.next_state("idle", timeout=60)
        await eventually(lambda: gone(old), 10, what="the orphaned engine gone")
        ours = {p.pid for p in dogs.remember(second)}
        assert listeners(port) and set(listeners(port)) <= ours
        assert starts(tmp_path) == 2, second.log()[-3000:]  # one engine each, no port clash
        assert "address already in use" not in second.log()
        assert await dogs.stop(second) == -signal.SIGTERM  # (ended by the signal it got)


def fake_pyspy(tmp: Path) -> Path:
    """A py-spy whose dumps hang for 2 minutes; its calls land in ``calls.log`` beside it."""
    where = tmp / "fake-pyspy"
    where.mkdir()
    shutil.copy(FAKE_PYSPY, where / "fake_pyspy.py")
    hang = {"sleep": 120}
    (where / "fake_pyspy.json").write_text(json.dumps(dict.fromkeys(("native", "plain"), hang)))
    exe = where / "py-spy"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {where / "fake_pyspy.py"} "$@"\n')
    exe.chmod(0o755)
    return exe


def dump_pids(pyspy: Path) -> list[int]:
    calls = pyspy.with_name("calls.log")
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [int(line.split()[1]) for line in lines]


async def test_kill_9_mid_capture_leaves_no_py_spy_and_no_temporary_bundle(
    tmp_path: Path, sim_factory: SimFactory
) -> None:
    sim = await sim_factory("--fault", "spin")
    incidents, pyspy = tmp_path / "incidents", fake_pyspy(tmp_path)
    async with Watchdogs(tmp_path) as dogs:
        client = asyncio.create_task(keep_asking(sim.port))
        try:
            watch = await dogs.start(
                "watch", sim.url, "--incident-dir", str(incidents), "--action", "capture",
                "--py-spy", str(pyspy), "--stall-seconds", "4", "--startup-grace", "0",
                "--canary-timeout", "2", name="watch",
            )  # fmt: skip
            await watch.next_state("stalled", timeout=40)
            pids = await eventually(lambda: dump_pids(pyspy), 20, 0.1, what="a py-spy dump")
            dumps = [psutil.Process(pid) for pid in pids]
            assert list(incidents.glob(".tmp-*")), "no capture under way"
            watch.proc.send_signal(signal.SIGKILL)
            await watch.proc.wait()
            await eventually(lambda: gone(dumps), 5, what="py-spy ended with its watchdog")
        finally:
            client.cancel()
            kill_all(dumps_of(pyspy))
        again = await dogs.start(
            "watch", sim.url, "--incident-dir", str(incidents), "--action", "none", name="again"
        )
        await again.next_state(None, timeout=40)  # up and judging: its start is behind it
        assert not list(incidents.glob(".tmp-*")), list(incidents.iterdir())


def dumps_of(pyspy: Path) -> list[psutil.Process]:
    """The fake py-spy processes still running (for the cleanup: they are ours)."""
    procs = []
    for pid in dump_pids(pyspy):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            if "fake_pyspy.py" in " ".join(proc.cmdline()):
                procs.append(proc)
    return procs


async def test_a_second_run_for_a_supervised_engine_is_refused_and_touches_nothing(
    tmp_path: Path,
) -> None:
    port, incidents = free_port(), tmp_path / "incidents"
    url = f"http://127.0.0.1:{port}"
    args = ("--incident-dir", str(incidents), "--", *sim_engine(tmp_path, port))
    async with Watchdogs(tmp_path) as dogs:
        first = await dogs.start("run", url, *args, name="first")
        await first.next_state("idle", timeout=40)
        engine = dogs.remember(first)
        ran = await run_cli("run", url, "--listen", "", *args, timeout=60)
        assert ran.code == 64, ran.err
        errors = [line for line in ran.err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "already supervises" in errors[0], ran.err
        assert all(p.is_running() for p in engine) and starts(tmp_path) == 1
        assert await dogs.stop(first) == -signal.SIGTERM
