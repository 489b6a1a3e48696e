"""TGI's process layout, with real processes: a launcher starts the HTTP router and the Python
shards side by side, so the shards are not below the process that holds the port. Discovery from
the URL must still find them (and not the launcher), and the bundle must hold their stacks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from engine_watchdog.capture.bundle import BundleSettings, write_bundle
from engine_watchdog.capture.pyspy import pyspy_step
from engine_watchdog.core.model import Cause, State, Verdict
from engine_watchdog.core.settings import CaptureSettings
from engine_watchdog.engines import TGI
from engine_watchdog.host.tools import resolve_tools
from engine_watchdog.probes.procs import sample_procs_async
from engine_watchdog.sim.launcher import free_port
from tests.waiting import eventually

# The shard blocks in a function whose name the bundle must show.
SHARD = """
import time
def _tgi_shard_decode():
    time.sleep(120)
_tgi_shard_decode()
"""

# The launcher: one shard and the router (the simulator speaking TGI's dialect), as siblings.
# Both scripts are files named like TGI's programs, so the command lines read like TGI's.
LAUNCHER = """
import subprocess, sys, time
port, shard = sys.argv[1], sys.argv[2]
kids = [
    subprocess.Popen([sys.executable, shard, "serve", "m", "--uds-path", "/tmp/tgi-server"]),
    subprocess.Popen([sys.executable, "-m", "engine_watchdog.sim", "--dialect", "tgi",
                      "--host", "127.0.0.1", "--port", port]),
]
time.sleep(120)
"""


@dataclass
class Layout:
    launcher: asyncio.subprocess.Process
    url: str


@pytest.fixture
async def tgi_layout(tmp_path: Path) -> AsyncIterator[Layout]:
    port = free_port()
    launcher_path = tmp_path / "text-generation-launcher"
    shard_path = tmp_path / "text-generation-server"
    launcher_path.write_text(LAUNCHER)
    shard_path.write_text(SHARD)
    cmd = [sys.executable, str(launcher_path), str(port), str(shard_path)]
    launcher = await asyncio.create_subprocess_exec(
        *cmd, start_new_session=True, stdin=subprocess.DEVNULL
    )
    layout = Layout(launcher, f"http://127.0.0.1:{port}")
    try:
        await eventually(lambda: _healthy(layout.url), timeout=20, what="router /health 200")
        yield layout
    finally:  # the launcher's group holds every process it started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        await asyncio.wait_for(launcher.wait(), 10)


async def _healthy(url: str) -> bool:
    timeout = aiohttp.ClientTimeout(total=2)
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        async with aiohttp.ClientSession() as http, http.get(url + "/health", timeout=timeout) as r:
            return r.status == 200
    return False


@pytest.mark.skipif(not resolve_tools().get("py-spy"), reason="py-spy not installed")
async def test_tgi_shards_beside_the_router_are_found_and_dumped(
    tgi_layout: Layout, tmp_path: Path
) -> None:
    obs = await sample_procs_async(tgi_layout.url, profile=TGI)
    by_role: dict[str, list[int]] = {}
    for p in obs.procs:
        by_role.setdefault(p.role, []).append(p.pid)
    shard = [p for p in obs.procs if "text-generation-server" in p.title]
    assert len(shard) == 1 and shard[0].role == "engine-core", obs.procs
    assert tgi_layout.launcher.pid not in {p.pid for p in obs.procs}  # a supervisor, not ours
    assert by_role.get("api-server"), obs.procs  # the router, found by its port

    verdict = Verdict(t=time.time(), engine="0", state=State.STALLED, cause=Cause.NO_PROGRESS)
    res = await write_bundle(
        BundleSettings(CaptureSettings(incident_dir=tmp_path)),
        verdict,
        obs.procs,
        [],
        [pyspy_step()],
    )
    assert res.steps[0].status in ("ok", "partial"), res.steps[0].detail
    stacks = json.loads((res.path / "pyspy" / f"{shard[0].pid}.json").read_text())
    assert any(f["name"] == "_tgi_shard_decode" for th in stacks for f in th["frames"])
