"""``watch`` and ``run``: the long-running loops, the HTTP endpoints, as named guarded tasks.

If any long-lived task dies, the process says why and exits non-zero: a watchdog that silently
stopped watching is worse than none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from engine_watchdog.core.checks import parse_listen
from engine_watchdog.core.serving import ANSWER_S
from engine_watchdog.core.settings import ProcessSettings, SettingsError, WatchSettings
from engine_watchdog.host.logs import bind
from engine_watchdog.net.bounded import bounded, end_tasks
from engine_watchdog.recovery.supervise import OUTPUT_DRAIN_S, STOP_GRACE_S
from engine_watchdog.report.console import verdict_dict
from engine_watchdog.report.metrics import WatchdogMetrics
from engine_watchdog.runtime.act.supervisor import ActionListener
from engine_watchdog.runtime.assembly import ConsoleReporter, Target, Task, assemble
from engine_watchdog.runtime.endpoints import Server, make_app, start_server
from engine_watchdog.runtime.loop import release_freed_memory
from engine_watchdog.runtime.stopping import MARGIN_S, Stopping
from engine_watchdog.runtime.watch.watcher import Reporter, Watcher

__all__ = ["ConsoleReporter", "probe_loop", "run_guarded", "run_watch"]
log = logging.getLogger(__name__)
EXIT_TASK_DIED = 70  # EX_SOFTWARE
TASK_END_S = 3.0
"""At a stop: how long the cancelled tasks get to end (each cleans up in a bounded way)."""
CLOSE_S = 5.0
"""A target's close (guard, watcher, trace), less its supervised engine's."""
CHILD_STOP_S = STOP_GRACE_S + 10.0 + OUTPUT_DRAIN_S + 1.0
"""The supervised engine's stop: SIGTERM and its grace, SIGKILL and its wait, its output."""


TRIM_AFTER_ROUNDS = frozenset({1, 10})
"""After these rounds the C heap's free pages go back (runtime/loop.py), as they do once the
targets are assembled: the first round holds the first scrape and engine detection, the first
ten the first GPM pair, canary and process rediscovery."""


def print_line(line: str) -> None:
    # Flushed: stdout is a pipe or a file in a container (block-buffered), and a log shipper or
    # `tail -f` must see a stall when it is said, not 8 KB of verdicts later.
    print(line, flush=True)


async def probe_loop(
    watcher: Watcher, reporters: list[Reporter], rounds: int | None = None
) -> None:
    """Probe at a fixed rate (a slow round delays the next, never piles rounds up)."""
    interval = watcher.interval_s
    next_at = time.monotonic()
    done = 0
    while rounds is None or done < rounds:
        changes = await watcher.tick()
        for reporter in reporters:
            reporter.report(watcher.target, changes, watcher.verdicts)
        done += 1
        if done in TRIM_AFTER_ROUNDS:
            release_freed_memory()
        next_at = max(next_at + interval, time.monotonic())
        # A canary's end starts the next round early. asyncio.timeout, not wait_for: wait_for
        # on 3.11 can lose a cancellation that meets the wake-up (CPython gh-86296), and a
        # probe loop that lost its cancellation never lets the process stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(next_at - time.monotonic()):
                await watcher.woken.wait()
        watcher.woken.clear()


class Fleet:
    """The targets one process watches, as they are assembled: what its own server reports
    (it listens before the first is made), and every task of each, named in one place."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.targets: list[Target] = []

    async def assemble(
        self,
        many: Sequence[WatchSettings],
        process: ProcessSettings,
        session: aiohttp.ClientSession,
        metrics: WatchdogMetrics,
        out: Callable[[str], None],
        *,
        command: list[str] | None,
        echo_engine: bool,
        action_listeners: Sequence[ActionListener],
    ) -> None:
        """Every target, each kept as it is made (closed by :meth:`close`, also on failure)."""
        echo, listen = echo_engine, process.guard_listen
        for s in many:
            made = await assemble(s, session, metrics, out, command, echo, listen, action_listeners)
            self.targets.append(made)

    def tasks(self, extra_reporters: Sequence[Reporter]) -> dict[str, Task]:
        """Every long task of every target, by name (as kopf's ``spawn_tasks``): the peer
        endpoint, the pushers, the readiness gate, the supervised engine's exits, the probe
        loop. Made here, when they start: none exists unawaited before."""
        tasks: dict[str, Task] = {}
        for t in self.targets:
            url = t.settings.url
            own: dict[str, Task] = {}
            if t.peering is not None:
                own[f"peers:{url}"] = t.peering.serve()
            for name, pusher in t.pushers.items():
                own[f"{name}:{url}"] = pusher.run()
            if t.gate is not None:
                own[f"readiness-gate:{url}"] = t.gate.run()
            if t.child is not None:
                own[f"engine-exits:{url}"] = t.child.watch_exits()
            own[f"probe-loop:{url}"] = probe_loop(t.watcher, [*t.reporters, *extra_reporters])
            tasks.update({name: _for_target(t.watcher.target, c) for name, c in own.items()})
        return tasks

    def status(self) -> dict[str, Any]:
        targets = self.targets
        engines = [
            verdict_dict(v, t.watcher.target) for t in targets for v in t.watcher.verdicts.values()
        ]
        return {"targets": [t.watcher.target for t in targets], "engines": engines}

    def live(self) -> tuple[bool, str]:
        failed = [
            t.settings.url for t in self.targets if t.supervisor and t.supervisor.liveness_failed
        ]
        if failed:
            return False, f"the recovery policy says these engines must restart: {failed}"
        return True, "watching"

    def ready(self) -> tuple[bool, str]:
        if self.stop.is_set():
            return False, "stopping"
        rounds = min((t.watcher.rounds for t in self.targets), default=0)
        return rounds > 0, f"{rounds} probe rounds"

    async def drain(self) -> None:
        """Every guard drains at once, each within its own budget (guard/drain.py)."""
        guarded = [t for t in self.targets if t.guard is not None]
        if not guarded:  # a plain watch: no guard module imported at start or at stop
            return
        from engine_watchdog.guard.drain import drain

        await asyncio.gather(
            *(drain(t.guard, t.settings.guard.drain_s) for t in guarded if t.guard)
        )

    async def close(self) -> None:
        await asyncio.gather(*(_close(t) for t in self.targets))


async def run_guarded(
    tasks: dict[str, Task],
    stop: asyncio.Event,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Run named tasks until ``stop`` is set (exit 0) or one of them ends (exit 70).
    ``on_stop`` runs once ``stop`` is set, while the tasks still run (the guard's drain);
    then every task is cancelled, and waited for a bounded time."""
    running: set[asyncio.Task[None]] = {
        asyncio.create_task(coro, name=name) for name, coro in tasks.items()
    }
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        done, _ = await asyncio.wait({*running, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stopper in done and on_stop is not None:
            await on_stop()
    finally:
        await end_tasks([*running, stopper], TASK_END_S)
    for task in done - {stopper}:
        exc = task.exception() if not task.cancelled() else None
        log.error("task %s ended unexpectedly: %r; exiting", task.get_name(), exc)
        return EXIT_TASK_DIED
    return 0


async def run_watch(
    settings: WatchSettings | Sequence[WatchSettings],
    process: ProcessSettings | None = None,
    stop: asyncio.Event | None = None,
    out: Callable[[str], None] = print_line,
    extra_reporters: list[Reporter] | None = None,
    command: list[str] | None = None,
    echo_engine: bool = True,
    action_listeners: list[ActionListener] | None = None,
) -> int:
    """Watch engines until stopped; with ``command`` (one engine), start and supervise it too.
    ``extra_reporters`` see every round's verdicts, ``action_listeners`` every action. Without
    ``stop``, SIGTERM and SIGINT stop it (runtime/stopping.py)."""
    many = [settings] if isinstance(settings, WatchSettings) else list(settings)
    process = process or ProcessSettings()
    stopping = None
    if stop is None:
        stopping = Stopping(_stop_budget(many[0], process, command))
        stopping.install()
        stop = stopping.event
    metrics = WatchdogMetrics()
    fleet = Fleet(stop)
    server = await _serve(process, metrics, fleet)  # first: a taken port stops all
    try:
        async with aiohttp.ClientSession() as session:
            try:
                await fleet.assemble(
                    many,
                    process,
                    session,
                    metrics,
                    out,
                    command=command,
                    echo_engine=echo_engine,
                    action_listeners=action_listeners or (),
                )
                # Imports and NVML's start are done: their garbage goes back before the first
                # round's allocations come on top of it (the process's high-water mark).
                release_freed_memory()
                return await run_guarded(fleet.tasks(extra_reporters or []), stop, fleet.drain)
            finally:
                await fleet.close()
    finally:
        if server is not None:
            await bounded(server.cleanup(), CLOSE_S, "the watchdog's own server's cleanup")
        if stopping is not None:
            stopping.done()


async def _for_target(target: str, task: Task) -> None:
    """A target's task, its log lines naming the target (host/logs.py)."""
    bind(target=target)
    await task


def _stop_budget(
    first: WatchSettings, process: ProcessSettings, command: list[str] | None
) -> float:
    """The longest an orderly stop may take before the backstop ends the process."""
    budget = MARGIN_S
    if process.guard_listen:
        budget += first.guard.drain_s + ANSWER_S
    if command:
        budget += CHILD_STOP_S
    return budget


async def _close(target: Target) -> None:
    bound = CLOSE_S + (CHILD_STOP_S if target.child is not None else 0.0)
    await bounded(target.close(), bound, f"closing the watch of {target.settings.url}")


async def _serve(process: ProcessSettings, metrics: WatchdogMetrics, fleet: Fleet) -> Server | None:
    if not process.listen:
        return None
    app = make_app(metrics.registry, fleet.status, live=fleet.live, ready=fleet.ready)
    host, port = parse_listen(process.listen)
    try:
        return await start_server(app, host, port)
    except OSError as exc:
        raise SettingsError(
            f"--listen {process.listen}: {exc.strerror or exc}; give a free host:port "
            "(or --listen '' for no server)"
        ) from None
