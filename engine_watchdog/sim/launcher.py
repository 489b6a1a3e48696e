"""Start a simulator as a subprocess on a free loopback port, and always clean it up.

For tests and the demo::

    async with SimProcess("--fault", "freeze-last") as sim:
        ...  # sim.url, sim.pid, sim.engine_pids()

The simulator runs in its own process group (session); stopping sends SIGTERM (and SIGCONT,
so stopped members can act on it) to the whole group, then SIGKILL after a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import aiohttp
import psutil

START_ATTEMPTS = 3
"""Port races (the free port taken before the simulator binds it) are retried this often."""

POLL_S = 0.1


class SimStartError(RuntimeError):
    """The simulator did not become healthy in time; the message ends with its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class SimProcess:
    """One simulator process (API + engine cores) in its own process group.

    ``args`` are extra ``engine-watchdog sim`` options (``--host``/``--port`` are chosen here).
    Its stdout and stderr go to ``log_path`` (a temporary file unless given; kept after stop
    for a post-mortem)."""

    def __init__(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 20.0,
        stop_timeout: float = 5.0,
        log_path: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.args = tuple(args)
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log_path = log_path or Path(
            tempfile.mkstemp(prefix="engine-watchdog-sim-", suffix=".log")[1]
        )
        self.host = "127.0.0.1"
        self.port = 0
        self.fixed_port = port
        """Listen here (a restarted engine keeps its port) instead of on a free port."""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("simulator not started")
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """Exit code of the API process, None while it runs."""
        return None if self._proc is None else self._proc.poll()

    def engine_pids(self) -> list[int]:
        """PIDs of the engine-core children, in rank order (empty once the API is gone)."""
        try:
            children = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return []
        cores: list[tuple[int, int]] = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                title = " ".join(child.cmdline()).strip()
                if "EngineCore" in title:  # EngineCore, or EngineCore_DP{rank}
                    rank = title.rpartition("_DP")[2]
                    cores.append((int(rank) if rank.isdigit() else 0, child.pid))
        return [pid for _, pid in sorted(cores)]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def __aenter__(self) -> SimProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start, and wait (bounded) until /health answers 200; retry a lost port race."""
        for attempt in range(START_ATTEMPTS):
            self.port = self.fixed_port or free_port(self.host)
            self._spawn()
            if await self._wait_healthy():
                return
            lost_race = "cannot listen" in self.log_text()
            await self.stop()
            if not lost_race or attempt == START_ATTEMPTS - 1:
                break
        tail = "\n".join(self.log_text().splitlines()[-30:])
        raise SimStartError(f"simulator not healthy within {self.startup_timeout} s:\n{tail}")

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "engine_watchdog.sim", "--host", self.host]
        cmd += ["--port", str(self.port), *self.args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(  # noqa: S603 (our own interpreter and module)
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stop() takes every member
            )

    async def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while time.monotonic() < deadline and self.returncode is None:
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with http.get(self.url + "/health") as resp:
                        if resp.status == 200:
                            return True
                await asyncio.sleep(POLL_S)
        return False

    async def wait_exit(self, timeout: float) -> int | None:
        """Wait (bounded) for the API process to exit; its exit code, or None if it runs on."""
        if self._proc is None:
            return None
        try:
            return await asyncio.to_thread(self._proc.wait, timeout)
        except subprocess.TimeoutExpired:
            return None

    async def stop(self) -> int | None:
        """SIGTERM the whole group, SIGKILL what is left after ``stop_timeout``; reap."""
        if self._proc is None:
            return None
        pgid = self._proc.pid  # session leader: its pid is the group id
        _killpg(pgid, signal.SIGTERM)
        _killpg(pgid, signal.SIGCONT)
        code = await self.wait_exit(self.stop_timeout)
        _killpg(pgid, signal.SIGKILL)  # stragglers (a stopped or hung engine core), if any
        if code is None:
            code = await self.wait_exit(self.stop_timeout)
        return code


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
