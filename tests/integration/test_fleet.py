"""Many engines at once: `check` over URLs, a targets file and a label selector; `watch` of many."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import aiohttp

from engine_watchdog.sim.launcher import free_port
from engine_watchdog.sim.loadgen import StreamingLoad
from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.cli import CONSOLE_SCRIPT, Ran, run_cli
from tests.tools.watch import fired, get, metric
from tests.waiting import eventually


async def test_fleet_check_one_line_each_a_summary_and_the_worst_exit_code(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Path
) -> None:
    healthy = await sim_factory("--tokens-per-second", "30")
    frozen = await sim_factory("--tokens-per-second", "30")
    closed = f"http://127.0.0.1:{free_port()}"
    async with StreamingLoad(frozen.url, clients=3, max_tokens=60, model="sim-model") as load:
        await load.wait_for(chunks=30, in_flight=2, timeout=30)
        await sim_http.set_fault(frozen, "freeze-last")
        load.stop_new()
        await eventually(lambda: fired(sim_http, frozen), timeout=30)
        targets = tmp_path / "targets.txt"
        targets.write_text(f"# the fleet\n{frozen.url}\n\n{closed}  # gone\n")
        ran = await run_cli("check", healthy.url, "--targets", str(targets), "--stall-seconds", "8")
    lines = ran.out.strip().splitlines()
    assert ran.code == 1, ran.out + ran.err  # stalled outranks unreachable
    # Idle is no proof: its canary answered, and its token is progress.
    assert lines[0].startswith(f"{healthy.url}: progressing")
    assert lines[1].startswith(f"{frozen.url}: stalled")
    assert lines[2].startswith(f"{closed}: unreachable")
    assert lines[3] == "3 targets: 1 progressing, 1 stalled, 1 unreachable"


async def test_selector_asks_kubectl_for_the_pods(sim_factory: SimFactory, tmp_path: Path) -> None:
    """kubectl is faked (no cluster runs here): it prints what `get pods -o json` prints."""
    sim = await sim_factory()
    port = sim.url.rsplit(":", 1)[1]
    pods = {
        "items": [
            {"status": {"phase": "Running", "podIP": "127.0.0.1"}},
            {"status": {"phase": "Pending"}},
        ]
    }
    fake = tmp_path / "kubectl"
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(pods)}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    os.environ["PATH"] = f"{tmp_path}:{os.environ['PATH']}"
    try:
        args = ["--selector", "app=vllm", "--port", port, "--json"]
        ran = await run_cli("check", *args)
    finally:
        os.environ["PATH"] = os.environ["PATH"].split(":", 1)[1]
    assert ran.code == 0, ran.out + ran.err
    assert ran.json()["target"] == sim.url


async def test_one_watch_process_watches_many_engines(sim_factory: SimFactory) -> None:
    sims = [await sim_factory() for _ in range(3)]
    listen = f"127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine_watchdog", "watch", *(s.url for s in sims),
        "--json", "--listen", listen, "--action", "none",
        stdout=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:

        async def all_idle() -> Any:
            try:
                _, text = await get(f"http://{listen}/metrics")
            except aiohttp.ClientError:
                return False  # not listening yet
            name = "engine_watchdog_engine_state"
            states = [metric(text, name, target=s.url, state="idle") for s in sims]
            return states == [1.0, 1.0, 1.0]

        await eventually(all_idle, timeout=30, interval=0.5, what="three engines idle")
        _, status = await get(f"http://{listen}/status")
        assert {e["target"] for e in json.loads(status)["engines"]} == {s.url for s in sims}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == -signal.SIGTERM  # (orderly)


async def test_a_fleet_check_stays_within_the_file_descriptor_limit(tmp_path: Path) -> None:
    """With a small RLIMIT_NOFILE (a container's default can be 1024, or less) a check of many
    engines judges every one of them: it holds only as many at once as the limit allows,
    instead of failing engines with 'Too many open files'."""
    targets = tmp_path / "targets.txt"
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.fleet", "--count", "150", "--serve", str(targets),
        start_new_session=True,
    )  # fmt: skip
    try:
        await eventually(lambda: targets.exists(), timeout=60, what="150 engines serving")
        ran = await _check_under_limit(targets, nofile=200)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        await server.wait()
    doc = json.loads(ran.out)
    # Every engine judged; the idle half, with --no-canary, proves nothing: undecided (exit 3,
    # a wedged core looks idle), which is not a fd failure (that would be unreachable, exit 2).
    assert ran.code == 3, (doc["summary"], ran.err[-2000:])
    assert doc["summary"] == {"idle": 75, "progressing": 75}


async def _check_under_limit(targets: Path, nofile: int) -> Ran:
    """`check` as a user runs it, with its file-descriptor limit set by prlimit(1)."""
    started = asyncio.get_running_loop().time()
    proc = await asyncio.create_subprocess_exec(
        "prlimit", f"--nofile={nofile}:{nofile}", str(CONSOLE_SCRIPT), "check", "--targets",
        str(targets), "--json", "--no-canary", "--stall-seconds", "10",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert proc.returncode is not None
    return Ran(
        proc.returncode, out.decode(), err.decode(), asyncio.get_running_loop().time() - started
    )
