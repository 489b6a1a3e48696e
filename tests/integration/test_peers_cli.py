"""Multi-node as a user runs it: a worker's ``engine-watchdog peer`` and the leader's ``watch
--peers`` as real processes on loopback ports, a real simulator as the leader's engine, a real
sleeping process as the worker's rank. The leader's capture rung puts both nodes into its one
bundle; the secret is in nothing either process wrote; bad input is one line and exit 64."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.host.tools import resolve_tools
from engine_watchdog.sim.launcher import free_port
from tests.tools.cli import CONSOLE_SCRIPT, run_cli
from tests.tools.watch import start_watch, stop_watch
from tests.waiting import eventually

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
SECRET = "cli-peer-secret-" + "c0ffee12345678"

pytestmark = pytest.mark.skipif(not resolve_tools().get("py-spy"), reason="py-spy not installed")


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    folder = tmp_path / "secret"  # as a Secret's volume: kept apart from what is grepped
    folder.mkdir()
    (folder / "secret").write_text(SECRET + "\n")
    return folder / "secret"


@pytest.fixture
async def rank() -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(DATA / "blocked_target.py"), "120",
        stdout=asyncio.subprocess.PIPE, start_new_session=True,
        env={**os.environ, "RANK": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"ready"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


def _peer_args(leader: int, worker: int, own: int, secret_file: Path) -> list[str]:
    return [
        "--peers", f"127.0.0.1:{leader},127.0.0.1:{worker}", "--peer-port", str(own),
        "--peer-bind", "127.0.0.1", "--peer-secret-file", str(secret_file),
    ]  # fmt: skip


async def test_the_leaders_capture_rung_bundles_every_node(
    tmp_path: Path, secret_file: Path, rank: Any, sim_factory: Any, sim_http: Any
) -> None:
    leader, worker = free_port(), free_port()
    out = tmp_path / "out"
    out.mkdir()
    with (out / "peer.out").open("wb") as peer_log:
        peer = await asyncio.create_subprocess_exec(
            str(CONSOLE_SCRIPT), "peer", "--pid", str(rank.pid),
            *_peer_args(leader, worker, worker, secret_file),
            stdout=peer_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    sim = await sim_factory("--tokens-per-second", "30")
    incidents = out / "incidents"
    watch = await start_watch(
        sim.url, "--action", "capture", "--incident-dir", str(incidents),
        "--idle-canary-interval", "2", "--canary-after", "1", "--peer-deadline", "10",
        *_peer_args(leader, worker, leader, secret_file), stderr=out / "watch.err",
    )  # fmt: skip
    try:
        await eventually(lambda: b"(worker) on" in (out / "peer.out").read_bytes(), 30)
        await sim_http.set_fault(sim, "deadlock")  # fires on the idle canary's step
        await watch.next_state("stalled", timeout=60)
        found = await eventually(lambda: list(incidents.glob("2*/nodes/group.json")), 60)
    finally:
        await stop_watch(watch)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(peer.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(peer.wait(), 15)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(peer.pid, signal.SIGKILL)
    nodes = found[0].parent
    group = json.loads((nodes / "group.json").read_text())
    assert [n["answered"] for n in group["nodes"]] == [True, True], group
    theirs = json.loads((nodes / f"127.0.0.1_{worker}" / "manifest.json").read_text())
    (sample,) = theirs["ranks"]
    assert sample["pid"] == rank.pid and sample["rank"] == 1 and len(sample["stacks"]) == 2
    text = (nodes / f"127.0.0.1_{worker}" / theirs["stack_files"][0]).read_text()
    assert "engine_step_blocked_on_lock" in text
    ours = json.loads((nodes / f"127.0.0.1_{leader}" / "manifest.json").read_text())
    assert ours["answered"] and ours["ranks"], ours  # the simulator's engine core, in-process
    assert peer.returncode == -signal.SIGTERM  # an orderly stop, ended as the signal would
    # Who stopped the group comes first, in summary.md and in report.md alike.
    summary = (nodes.parent / "summary.md").read_text().splitlines()
    assert summary[2] == "## Culprit" and summary[4].startswith("**Culprit: "), summary[:8]
    culprit = group["culprit"]
    reported = await run_cli("report", str(nodes.parent), "-o", str(out / "report.md"))
    assert reported.code == 0, reported.err
    report = (out / "report.md").read_text()
    assert summary[4] in report and report.index(summary[4]) < report.index("stopped making")
    assert culprit["why"] in report
    for path in out.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["peer"], "peer: not in a group"),
        (
            [
                "peer",
                "--peers",
                "127.0.0.1:1,127.0.0.1:2",
                "--peer-port",
                "2",
                "--peer-bind",
                "127.0.0.1",
            ],
            "--peer-secret-file",
        ),
        (
            ["peer", "--peers", "127.0.0.1:1,example.invalid:2", "--peer-port", "3"],
            "is not in the list",
        ),
        (["watch", "http://127.0.0.1:9401", "--peers", "127.0.0.1:9401"], "--peer-port 9401"),
    ],
)
async def test_bad_peer_input_is_one_line_and_exit_64(
    args: list[str], says: str, tmp_path: Path
) -> None:
    # No group's or peer's variables; the test's own incident dir stays (the watch checks it).
    kept = ("ENGINE_WATCHDOG_INCIDENT_DIR",)
    env = {
        k: v
        for k, v in os.environ.items()
        if k in kept or not k.startswith(("LWS_", "ENGINE_WATCHDOG_"))
    }
    if says != "--peer-secret-file":  # the other mistakes, with the secret there
        env["ENGINE_WATCHDOG_PEER_SECRET"] = SECRET
    ran = (
        await run_cli(*args, "--listen", "", timeout=30, env=env)
        if args[0] == "watch"
        else (await run_cli(*args, timeout=30, env=env))
    )
    assert ran.code == 64, ran
    (line,) = [x for x in ran.err.splitlines() if x.startswith("error:")]
    assert says in line and line == ran.err.strip().splitlines()[-1]
    assert "Traceback" not in ran.err and SECRET not in ran.err + ran.out
