"""``engine-watchdog run`` and ``watch`` as real processes, for the recovery hardening tests.

The installed console script, in its own process group, stderr in a file. A :class:`Watchdogs`
remembers every engine process it ever saw under a watchdog (supervise mode starts the engine
in a session of its own, so ending the watchdog's group does not reach it) and kills what is
left of them, and of the watchdogs, when the test ends, pass or fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import psutil

from engine_watchdog.sim.launcher import free_port
from tests.tools.cli import CONSOLE_SCRIPT

SIM_ENGINE = """
import os, pathlib, sys
starts = pathlib.Path(sys.argv[1])
n = int(starts.read_text()) if starts.exists() else 0
starts.write_text(str(n + 1))
faults = sys.argv[3].split(",")
fault = faults[n] if n < len(faults) else "none"
os.execv(sys.executable, [sys.executable, "-m", "engine_watchdog.sim", "--port", sys.argv[2],
                          "--fault", fault])
"""
STOP_S = 40.0


def sim_engine(tmp: Path, port: int, faults: Sequence[str] = ()) -> list[str]:
    """An engine command: the simulator on ``port``, with ``faults[n]`` armed at its n-th start
    (none after the list); it counts its starts in ``tmp/starts``."""
    script = tmp / "engine.py"
    script.write_text(SIM_ENGINE)
    return [sys.executable, str(script), str(tmp / "starts"), str(port), ",".join(faults) or "none"]


def starts(tmp: Path) -> int:
    path = tmp / "starts"
    return int(path.read_text()) if path.exists() else 0


def history(incident_dir: Path) -> list[dict[str, Any]]:
    path = incident_dir / "actions.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


async def keep_asking(port: int) -> None:
    """One client after the other, forever (a hung engine needs work in flight to be judged
    stalled); each request bounded. Cancel the task to stop it."""
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 4}
    url = f"http://127.0.0.1:{port}/v1/completions"
    async with aiohttp.ClientSession() as s:
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with s.post(url, json=body, timeout=aiohttp.ClientTimeout(10)) as r:
                    await r.read()
            await asyncio.sleep(0.3)


def listeners(port: int) -> list[int]:
    """PIDs listening on ``port`` now."""
    found = set()
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            found.add(c.pid)
    return sorted(found)


@dataclass
class Watchdog:
    proc: asyncio.subprocess.Process
    stderr_path: Path
    listen: str
    lines: list[dict[str, Any]] = field(default_factory=list)

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def next_state(self, state: str | None, timeout: float) -> dict[str, Any]:
        """Read JSON transition lines until one enters ``state`` (None: any)."""
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    line = await self.proc.stdout.readline()
                    assert line, f"the watchdog exited:\n{self.log()[-3000:]}"
                    doc: dict[str, Any] = json.loads(line)
                    self.lines.append(doc)
                    if state in (None, doc["state"]):
                        return doc
        except TimeoutError:
            seen = [(d["state"], d.get("cause")) for d in self.lines[-5:]]
            raise AssertionError(
                f"no {state!r} in {timeout} s (last: {seen}):\n{self.log()[-3000:]}"
            ) from None

    async def metrics(self) -> str:
        bound = aiohttp.ClientTimeout(total=5)
        async with (
            aiohttp.ClientSession(timeout=bound) as s,
            s.get(f"http://{self.listen}/metrics") as r,
        ):
            return await r.text()

    def engine_procs(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


class Watchdogs:
    """Starts watchdogs; on exit ends them and every engine process seen under one."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Watchdog] = []
        self.seen: dict[int, psutil.Process] = {}

    async def start(self, command: str, url: str, *args: str, name: str = "watchdog") -> Watchdog:
        listen = f"127.0.0.1:{free_port()}"
        while listen.rpartition(":")[2] in url:  # free_port may hand out the engine's port
            listen = f"127.0.0.1:{free_port()}"
        with (self.tmp / f"{name}.err").open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                str(CONSOLE_SCRIPT), command, url, "--json", "--listen", listen, *args,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=err,
                start_new_session=True,
            )  # fmt: skip
        self.started.append(Watchdog(proc, self.tmp / f"{name}.err", listen))
        return self.started[-1]

    def remember(self, watchdog: Watchdog) -> list[psutil.Process]:
        procs = watchdog.engine_procs()
        for p in procs:
            self.seen.setdefault(p.pid, p)
        return procs

    async def stop(self, watchdog: Watchdog) -> int:
        """SIGTERM (it stops its engine), SIGKILL after STOP_S; its exit code."""
        self.remember(watchdog)
        if watchdog.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(watchdog.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(watchdog.proc.wait(), STOP_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(watchdog.proc.pid, signal.SIGKILL)
                await watchdog.proc.wait()
        assert watchdog.proc.returncode is not None
        return watchdog.proc.returncode

    async def __aenter__(self) -> Watchdogs:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for watchdog in self.started:
            self.remember(watchdog)
            if watchdog.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(watchdog.proc.pid, signal.SIGKILL)
                await watchdog.proc.wait()
        await asyncio.to_thread(kill_all, list(self.seen.values()))


def kill_all(procs: list[psutil.Process]) -> None:
    """SIGCONT and SIGKILL what still runs of ``procs`` (is_running guards against PID reuse)."""
    alive = [p for p in procs if p.is_running()]
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
    psutil.wait_procs(alive, timeout=10)
