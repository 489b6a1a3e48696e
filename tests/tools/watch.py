"""`watch` as a real process, and what tests read from it and from the simulator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from engine_watchdog.sim.launcher import SimProcess, free_port
from tests.tools.cli import CONSOLE_SCRIPT


class WatchProcess:
    def __init__(self, proc: asyncio.subprocess.Process, listen: str) -> None:
        self.proc = proc
        self.base = f"http://{listen}"
        self.lines: list[dict[str, Any]] = []

    async def next_state(
        self, state: str, timeout: float, cause: str | None = None
    ) -> dict[str, Any]:
        """Read JSON transition lines until one enters ``state`` (with ``cause``, if given)."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.proc.stdout.readline()
                assert line, "watch exited"
                doc: dict[str, Any] = json.loads(line)
                self.lines.append(doc)
                if doc["state"] == state and cause in (None, doc["cause"]):
                    return doc


async def start_watch(
    url: str, *args: str, stderr: Path | None = None, env: dict[str, str] | None = None
) -> WatchProcess:
    """``engine-watchdog watch URL --json`` with its own /metrics port, in its own process
    group (stop it with :func:`stop_watch`); its log goes to ``stderr`` when given."""
    listen = f"127.0.0.1:{free_port()}"
    # As a user's shell runs it: this host exports PYTHONUNBUFFERED, which once hid that --json
    # lines sat in stdout's buffer when stdout was a pipe (a container's, a `| jq`).
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONUNBUFFERED", None)
    with contextlib.ExitStack() as files:
        log = files.enter_context(stderr.open("wb")) if stderr is not None else None
        proc = await asyncio.create_subprocess_exec(
            str(CONSOLE_SCRIPT), "watch", url, "--json", "--listen", listen, *args,
            stdout=asyncio.subprocess.PIPE, stderr=log, start_new_session=True, env=env,
        )  # fmt: skip
    return WatchProcess(proc, listen)


async def stop_watch(watch: WatchProcess) -> None:
    if watch.proc.returncode is None:
        os.killpg(watch.proc.pid, signal.SIGKILL)
        await watch.proc.wait()


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(5)) as r:
        return r.status, await r.text()


def metric(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return float(s.value)
    return None


async def fired(http: Any, sim: SimProcess) -> bool:
    """The seed's freeze happened: the engine stopped stepping with a request in flight."""
    _, doc = await http.get(sim, "/sim/fault")
    return bool(doc["engines"]["0"].get("state") == "fired")
