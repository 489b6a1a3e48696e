"""A real collective hang across pods, on the CPU: torch gloo ranks, each in its own network and
PID namespace, as the engine's UID (tests/tools/gloo_group.py).

- SIGSTOP of one rank: the other's heartbeat stops (it waits in all_reduce), py-spy from the
  root namespace dumps both, through the watchdog's own capture code;
- a rank that stays out of the collective: the same shape, but the culprit is running;
- the group stopped (SIGKILL of every pod's PID 1): node_clean finds and removes the shared
  memory segments the ranks left, leaves what is not the engine's, and nothing is left over.

The py-spy dumps are kept under the test's tmp_path (printed), nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine_watchdog.capture.pyspy import PySpyOptions, dump_process
from engine_watchdog.core.model import ProcInfo
from engine_watchdog.host.proclist import PsutilProcesses
from engine_watchdog.host.tools import resolve_tools
from engine_watchdog.recovery.node_clean import EngineRef, clean_node, write_report
from tests.integration.conftest import steady
from tests.tools.fake_nvml import FakeNvml
from tests.tools.gloo_group import ENGINE_UID, GlooGroup, namespaces_left, netns_missing
from tests.tools.vllm_env import VENV_ENV_VAR
from tests.waiting import eventually

VENV = Path(os.environ.get(VENV_ENV_VAR, Path(__file__).parents[2] / ".cache" / "vllm-venv"))
PYTHON = VENV / "bin" / "python"
OTHER_UID = 1001
HANG_WINDOW_S = 2.0
"""Heartbeats every ~20 ms: 2 s without one is a hang, not a slow loop."""
WAIT_S = 60.0


def _missing() -> str | None:
    if not PYTHON.exists():
        return f"no torch here: {PYTHON} missing (tests/tools/vllm_env.py builds it)"
    if not resolve_tools().get("py-spy"):
        return "py-spy not installed"
    return netns_missing()


pytestmark = pytest.mark.skipif(bool(_missing()), reason=str(_missing()))


@pytest.fixture
def group() -> Iterator[GlooGroup]:
    with GlooGroup(2, Path(tempfile.gettempdir()), PYTHON) as started:
        started.wait_stepping()
        ranks = [psutil.Process(r.host_pid) for r in started.ranks]
        yield started
    assert namespaces_left(started.tag) == [], "a namespace outlived its group"
    assert not [p for p in ranks if running(p)], "a rank outlived its group"


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False  # gone


async def hung(group: GlooGroup, waiting: int) -> int:
    """Wait until rank ``waiting`` stops completing collectives; hold it for a window."""
    last: list[int] = []

    def settled() -> bool:
        last.append(group.steps()[waiting])
        return len(last) > 10 and last[-1] == last[-11]  # ~0.5 s of polls, no step

    await eventually(settled, WAIT_S, what=f"rank {waiting} waiting")

    async def step() -> int:
        return group.steps()[waiting]

    return await steady(step, HANG_WINDOW_S, what=f"rank {waiting}'s step")


async def dump(group: GlooGroup, i: int, out: Path) -> list[str]:
    """py-spy from the root namespace, as the capture step runs it; the main thread's frames."""
    pid = group.ranks[i].host_pid
    state = "stopped" if psutil.Process(pid).status() == psutil.STATUS_STOPPED else "sleeping"
    proc = ProcInfo(pid, 0, "worker", f"rank{i}", state, 0.0)
    pyspy = resolve_tools()["py-spy"]
    outcome = await dump_process(pyspy, proc, out, 30.0, PySpyOptions(native_timeout_s=5.0))
    assert outcome.status == "ok", outcome
    threads: list[dict[str, Any]] = json.loads((out / f"pyspy/{pid}.json").read_text())
    main = next(t for t in threads if t.get("thread_name") == "MainThread")
    return [f"{f['name']} ({f['filename']})" for f in main["frames"]]


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], 29500), timeout=2).close()\n"
    "    print('reached')\n"
    "except OSError as exc:\n"
    "    print('refused', exc)\n"
)


async def test_sigstop_of_one_rank_hangs_the_other_in_all_reduce(
    group: GlooGroup, tmp_path: Path
) -> None:
    # Pod 1 reaches rank 0's rendezvous port on its pod address; the host has no such address.
    probe = group.run(1, "probe", ["/usr/bin/python3", "-c", CONNECT, group.ranks[0].address], 0)
    await eventually(lambda: probe.proc.poll() is not None, WAIT_S, what="the probe ended")
    assert "reached" in probe.log.read_text(), probe.log_tail()
    host = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    assert group.ranks[0].address not in host
    group.stop(1)
    await hung(group, waiting=0)
    waiting, stopped = await dump(group, 0, tmp_path), await dump(group, 1, tmp_path)
    print(f"\npy-spy dumps: {tmp_path / 'pyspy'}")
    assert waiting[0].startswith("all_reduce (") and "distributed_c10d.py" in waiting[0], waiting
    assert psutil.Process(group.ranks[1].host_pid).status() == psutil.STATUS_STOPPED
    assert any("gloo_rank.py" in frame for frame in stopped), stopped
    group.resume(1)
    before = group.steps()[0]
    await eventually(lambda: group.steps()[0] > before, WAIT_S, what="the group resumed")


async def test_a_rank_out_of_the_collective_hangs_the_other(
    group: GlooGroup, tmp_path: Path
) -> None:
    group.skip(1)
    step = await hung(group, waiting=0)
    beat = group.heartbeat(1)["beat"]
    await eventually(lambda: group.heartbeat(1)["beat"] > beat, WAIT_S, what="rank 1 beating")
    assert group.steps()[0] == step, "rank 0 completed a collective without rank 1"
    waiting, skipping = await dump(group, 0, tmp_path), await dump(group, 1, tmp_path)
    print(f"\npy-spy dumps: {tmp_path / 'pyspy'}")
    assert waiting[0].startswith("all_reduce ("), waiting
    assert not any(frame.startswith("all_reduce") for frame in skipping), skipping
    assert any(frame.startswith("skipped_collective") for frame in skipping), skipping
    group.unskip(1)
    await eventually(lambda: group.steps()[0] > step, WAIT_S, what="the group resumed")


async def test_a_rank_that_exits_is_an_error_not_a_hang(group: GlooGroup) -> None:
    """gloo sees the peer's socket close: the other rank's all_reduce raises, it ends."""
    group.exit(1)
    first, second = (r.container for r in group.ranks)
    assert first is not None and second is not None
    await eventually(lambda: second.proc.poll() == 3, WAIT_S, what="rank 1 exited")
    await eventually(lambda: first.proc.poll() == 4, WAIT_S, what="rank 0 ended")
    error = group.heartbeat(0)["error"]
    assert "Connection reset by peer" in error or "Connection closed" in error, error


async def test_node_clean_after_the_group_is_stopped(group: GlooGroup, tmp_path: Path) -> None:
    made = {p for i in range(2) for p in group.heartbeat(i)["segments"]}
    assert len(made) == 6 and all(Path(p).exists() for p in made), made
    other = group.shm_root / "nccl-otheruid"  # another UID's: never the engine's to remove
    other.write_bytes(b"x")
    os.chown(other, OTHER_UID, OTHER_UID)
    procs = PsutilProcesses()
    ranks = [procs.processes()[r.host_pid] for r in group.ranks]
    nothing = EngineRef(ENGINE_UID, ())  # no process named: the ranks themselves are left alone

    in_use = clean_node(nothing, procs, FakeNvml(), group.shm_root)
    assert in_use.removed == () and all(psutil.pid_exists(p.pid) for p in ranks)
    reasons = {i.what: i.reason for i in in_use.left}
    assert all(reasons[p].startswith("in use by PID ") for p in made), reasons

    live = [psutil.Process(r.pid) for r in ranks]
    group.kill()
    assert not [p for p in live if running(p)], "a rank outlived the kill"
    engine = EngineRef(ENGINE_UID, tuple(ranks), frozenset(r.sid for r in ranks))
    report = clean_node(engine, procs, FakeNvml(), group.shm_root)
    assert {i.what for i in report.removed} == made, report
    # The ranks died with their pods; one not reaped yet by the host's init is a zombie.
    assert all(i.kind == "zombie" for i in report.items if i.kind != "shm"), report
    assert [(i.what, i.reason) for i in report.left if i.kind == "shm"] == [
        (str(other), f"owned by UID {OTHER_UID}, not the engine's ({ENGINE_UID})")
    ]
    assert report.clean and report.errors == ()
    assert sorted(os.listdir(group.shm_root)) == ["nccl-otheruid"]
    recorded = json.loads(write_report(report, tmp_path).read_text())  # what the bundle keeps
    assert recorded["clean"] and len(recorded["removed"]) >= 6, recorded


ODD_UID = 4231
"""Owns nothing in the host's /dev/shm but what the 4-rank group makes there."""


async def test_four_ranks_one_stopped_and_node_clean_over_dev_shm(tmp_path: Path) -> None:
    """Four pods; SIGSTOP of rank 2: every other rank waits in all_reduce. Their segments
    are in the host's real /dev/shm (the pods' mount namespaces share its tmpfs); after the
    stop, node_clean over /dev/shm removes exactly those."""
    shm = Path("/dev/shm")
    if any(p.lstat().st_uid == ODD_UID for p in shm.iterdir()):
        pytest.skip(f"/dev/shm holds files of UID {ODD_UID} already")
    with GlooGroup(4, Path(tempfile.gettempdir()), PYTHON, shm_root=shm, uid=ODD_UID) as group:
        try:
            group.wait_stepping()
            group.stop(2)
            t0 = time.monotonic()
            await asyncio.gather(*(hung(group, waiting) for waiting in (0, 1, 3)))
            t1 = time.monotonic()
            stacks = dict(
                enumerate(await asyncio.gather(*(dump(group, i, tmp_path) for i in range(4))))
            )
            print(f"\nhang seen in {t1 - t0:.1f} s, 4 dumps in {time.monotonic() - t1:.1f} s")
            print(f"\npy-spy dumps: {tmp_path / 'pyspy'}")
            assert all(stacks[i][0].startswith("all_reduce (") for i in (0, 1, 3)), stacks
            made = {p for i in range(4) for p in group.heartbeat(i)["segments"]}
            procs = PsutilProcesses()
            ranks = [procs.processes()[r.host_pid] for r in group.ranks]
            group.kill()
            engine = EngineRef(ODD_UID, tuple(ranks), frozenset(r.sid for r in ranks))
            report = clean_node(engine, procs, FakeNvml(), shm)
        finally:
            for path in shm.glob("*"):  # whatever happened: none of the test's stays behind
                with contextlib.suppress(OSError):
                    if path.lstat().st_uid == ODD_UID:
                        path.unlink()
    assert len(made) == 12 and {i.what for i in report.removed} == made, report
    # Another UID 1000 process on this shared machine (a vLLM of another test) may hold a
    # segment in /dev/shm: left as not the engine's; none of the group's may be.
    assert [i for i in report.left if i.what in made] == [] and report.clean, report
    assert namespaces_left(group.tag) == []
