"""Supervise mode: the watchdog starts the engine as its child, and restarts it when asked.

For bare metal and Slurm, where nothing else would restart ``vllm serve``. The engine's output
goes to the watchdog's stderr and to a private log file (the bundle's log tail), the secrets of
its command line and of the environment it inherits masked (core/redact.py). An engine that exits
on its own (vLLM's API server exits once its engine core died) is only reported, as an
:class:`EngineExited` event: the supervisor decides whether to restart it (one rate limit, one
history, one counter for every restart) and asks for it through the recovery actions; a restart
asked for while one is under way is not done twice. The engine never outlives the watchdog
unsupervised: it gets SIGTERM when the watchdog dies, and a PID file lets the next watchdog end
what did not stop (recovery/orphans.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from engine_watchdog.core.model import Outcome, Result
from engine_watchdog.core.redact import Masker, redact_argv, secret_values
from engine_watchdog.host.pdeathsig import wrap
from engine_watchdog.host.tools import make_private_dirs
from engine_watchdog.recovery.engine_log import EngineLog, copy_output
from engine_watchdog.recovery.orphans import remove_stamp, write_stamp

log = logging.getLogger(__name__)
STOP_GRACE_S = 15.0
HARD_GRACE_S = 3.0
"""After SIGTERM, before SIGKILL, when a stuck engine is restarted (its stacks are in the bundle
already: the capture rung comes first)."""
OUTPUT_DRAIN_S = 5.0
"""After the engine ended: how long its last output may take to reach the log."""


@dataclass(frozen=True)
class EngineExited:
    """The child engine ended, and not because we ended it (a crash, a broken start-up)."""

    t: float
    """When its exit was seen (wall clock, like the action history)."""
    pid: int
    returncode: int


class ChildEngine:
    """The engine as our child: started, stopped and restarted when asked; its own exits are
    reported to ``on_exit``, never acted on here."""

    def __init__(
        self,
        command: Sequence[str],
        log_path: Path,
        on_exit: Callable[[EngineExited], None],
        echo: bool = True,
        pid_path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.echo = echo
        """Copy the engine's output to our stderr too (the log file always gets it)."""
        self.command = list(command)
        self.shown = " ".join(redact_argv(command))
        """The command as logs show it: its secrets redacted, once, here where it enters."""
        self._masker = Masker(secret_values(command, os.environ))
        self.log_path = log_path
        self.engine_log = EngineLog(log_path)
        self.pid_path = pid_path
        """Names the running engine for a watchdog started after this one dies (orphans.py)."""
        self.on_exit = on_exit
        self.clock = clock
        self.proc: asyncio.subprocess.Process | None = None
        self.started_t = 0.0
        self._lock = asyncio.Lock()
        self._stopping = False
        self._started = asyncio.Event()
        self._output: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the engine: its own process group, SIGTERM when this watchdog dies."""
        make_private_dirs(self.log_path.parent)
        self.proc = await asyncio.create_subprocess_exec(
            *wrap(self.command, signal.SIGTERM),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: we end all of it, and only it
        )
        self.started_t = self.clock()
        log.warning("engine started: pid %d: %s", self.proc.pid, self.shown)
        assert self.proc.stdout is not None
        self._output = asyncio.create_task(
            copy_output(self.proc.stdout, self.engine_log, self.echo, self._masker.data),
            name="engine-output",
        )
        if self.pid_path is not None:
            await asyncio.to_thread(write_stamp, self.pid_path, self.proc.pid)
        self._started.set()

    async def restart(self, stalled_since: float) -> Outcome:
        """The supervisor's restart (its rate limit checked): end the engine if it still runs,
        start the next; never two for one death."""
        async with self._lock:
            if self.started_t > stalled_since:
                return Outcome(Result.SKIPPED, "the engine was restarted after the stall began")
            await self._stop(hard=True)
            await self.start()
        return Outcome(Result.OK, f"engine restarted (pid {self.proc.pid if self.proc else '?'})")

    async def watch_exits(self) -> None:
        """Long-lived task: report each exit we did not cause, then wait for the next engine
        (the supervisor decides whether and when it comes)."""
        while not self._stopping:
            proc = self.proc
            assert proc is not None
            rc = await proc.wait()
            async with self._lock:
                if proc is not self.proc or self._stopping:
                    continue  # we replaced or stopped it ourselves
                self._started.clear()
            log.warning("engine exited by itself with code %d (pid %d)", rc, proc.pid)
            self.on_exit(EngineExited(self.clock(), proc.pid, rc))
            await self._started.wait()

    async def stop(self) -> None:
        self._stopping = True
        async with self._lock:
            await self._stop()
        if self._output is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._output, OUTPUT_DRAIN_S)
        self.engine_log.close()
        if self.pid_path is not None:
            remove_stamp(self.pid_path)

    async def _stop(self, hard: bool = False) -> None:
        """End the engine: gracefully on shutdown; ``hard`` (a stuck engine, restarted) kills
        its children first, so the API server fails the stuck requests and exits at once
        instead of waiting out the grace for streams that will never finish, and gives the rest
        HARD_GRACE_S: a single-process engine stuck in a step (llama.cpp's llama-server) never
        ends on SIGTERM (its handler waits for the step)."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if hard:
            await asyncio.to_thread(_kill_children, proc.pid)
        for sig, wait in (
            (signal.SIGCONT, 0.0),
            (signal.SIGTERM, HARD_GRACE_S if hard else STOP_GRACE_S),
            (signal.SIGKILL, 10.0),
        ):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), wait)
            if proc.returncode is not None:
                break
        # Children that left the group (none expected) die with their parent's session anyway.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _kill_children(pid: int) -> None:
    """SIGCONT and SIGKILL every descendant of ``pid`` (blocking; psutil)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            child.send_signal(signal.SIGCONT)
            child.kill()
