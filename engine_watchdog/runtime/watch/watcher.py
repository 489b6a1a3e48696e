"""One watched engine's probe rounds: its prober probes (runtime/watch/probing.py), its judge judges
(runtime/watch/judge.py), and the round's records go to the timeline and the trace
(runtime/trace/recording.py).

The watcher owns no policy and no part's state: it runs one round at a time (:meth:`Watcher.tick`)
and the run loop (runner.py) or the one-shot check (check.py) decides what to do with the
verdicts. The parts talk through the typed channels of a :class:`~events.Bus`, wired in
:func:`watcher_for`; nothing reads the records back to decide.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from engine_watchdog.core.model import Transition, Verdict
from engine_watchdog.core.settings import WatchSettings
from engine_watchdog.net.connection import EngineConnection, connection_for
from engine_watchdog.probes.nvml import GpuProbe
from engine_watchdog.runtime.events import Bus, StuckHandled
from engine_watchdog.runtime.trace.format import encode_handled
from engine_watchdog.runtime.trace.recording import RoundRecords
from engine_watchdog.runtime.watch.judge import Judge
from engine_watchdog.runtime.watch.notices import Notices
from engine_watchdog.runtime.watch.probing import Prober, WireSource

__all__ = ["Reporter", "Watcher", "WireSource", "watcher_for"]


class Reporter(Protocol):
    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        """Called after every probe round, with the round's transitions (maybe none)."""


class Watcher:
    """Runs one engine's probe rounds: probe, judge, publish the round's records."""

    def __init__(self, prober: Prober, judge: Judge, records: RoundRecords | None) -> None:
        """``records``: where the round's records go (None: kept nowhere, as for ``check``)."""
        self.prober, self.judge, self._records = prober, judge, records
        self.target = prober.target
        """The engine as every report names it (credentials redacted)."""
        self.interval_s = prober.settings.probe.interval_s
        self.rounds = 0

    async def tick(self) -> list[Transition]:
        """One probe round: every probe concurrently, then judge in time order."""
        changes = self.judge.judge(await self.prober.round(self.judge.fed_t))
        if self._records is not None:
            self._records.publish()
        if self.judge.canary_due():
            self.prober.send_canary()
        self.rounds += 1
        return changes

    def close(self) -> None:
        self.prober.close()

    @property
    def verdicts(self) -> dict[str, Verdict]:
        return self.judge.verdicts

    @property
    def woken(self) -> asyncio.Event:
        """Set when a canary ends: the next round starts at once."""
        return self.prober.woken


def watcher_for(
    settings: WatchSettings,
    session: aiohttp.ClientSession,
    *,
    bus: Bus | None = None,
    records: RoundRecords | None = None,
    connection: EngineConnection | None = None,
    gpu: GpuProbe | None = None,
    wire: WireSource | None = None,
    clock: Callable[[], float] = time.time,
) -> Watcher:
    """One engine's prober, judge and records, each with its collaborators, talking on ``bus``:
    the prober names the engine to the judge, a restart the actions made reaches the judge, and
    the supervisor's answers to stuck requests go into the records. ``wire``: the guard in
    front of this engine, if one runs in this process."""
    bus = bus or Bus()
    record = records.hold if records is not None else _drop
    notices = Notices(settings.url)
    connection = connection or connection_for(settings)
    prober = Prober(settings, session, clock, notices, record, bus.named, connection, gpu, wire)
    known = None if prober.detecting else prober.profile
    judge = Judge(settings.detector, known, clock, notices, record, bus.stuck, bus.observed)
    bus.named.subscribe(judge.on_named)
    bus.restarted.subscribe(judge.on_restarted)

    def handled(event: StuckHandled) -> None:  # published with the next round
        record(encode_handled(clock(), event))

    bus.handled.subscribe(handled)
    return Watcher(prober, judge, records)


def _drop(rec: dict[str, Any]) -> None:
    """The record sink of a watcher that keeps no records (``check``)."""
