"""One watched engine: a prober (runtime/probing.py) and a judge (runtime/judging.py), run one
round at a time, with the round's records kept for the timeline and the trace.

The watcher owns no policy and no state of the probes' or the detector's: each part owns its
own, and the parts talk through typed channels (runtime/events.py) handed to them when built.
``tick()`` runs one round; the run loop (runner.py) and the one-shot check (check.py) decide
what to do with the verdicts. It is also the recovery actions' view of the engine
(recovery.actions.EngineHandle).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from engine_watchdog.core.model import Observation, ProcInfo, ScrapeObs, Transition, Verdict
from engine_watchdog.core.settings import WatchSettings
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.connection import EngineConnection, connection_for
from engine_watchdog.probes.canary import Canary
from engine_watchdog.probes.gpu import GpuProbe
from engine_watchdog.probes.procs import sample_procs_async
from engine_watchdog.runtime.events import Channel, RequestsStuck
from engine_watchdog.runtime.judging import Judge
from engine_watchdog.runtime.notices import Notices
from engine_watchdog.runtime.probing import Prober, WireSource
from engine_watchdog.runtime.recording import RoundRecords

__all__ = ["Reporter", "Watcher", "WireSource"]


class Reporter(Protocol):
    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        """Called after every probe round, with the round's transitions (maybe none)."""


class Watcher:
    """Probes one engine server and judges it."""

    def __init__(  # every collaborator here, none set later
        self,
        settings: WatchSettings,
        session: aiohttp.ClientSession,
        clock: Callable[[], float] = time.time,
        gpu: GpuProbe | None = None,
        records: bool = True,
        wire: WireSource | None = None,
        stuck: Channel[RequestsStuck] | None = None,
        observed: Channel[Observation] | None = None,
        sinks: tuple[Callable[[dict[str, Any]], None], ...] = (),
        connection: EngineConnection | None = None,
    ) -> None:
        """``records``: keep each round's records for the timeline (bundles) and the trace
        writers (``sinks``); a one-shot ``check`` needs neither. ``wire``: the guard in front of
        this engine, if one runs in this process. ``stuck``: told each round's stuck requests
        (the supervisor); ``observed``: each observation as it is judged (the metrics)."""
        self.settings = settings
        self.target = settings.url
        """The engine as every report names it (credentials redacted)."""
        self.session = session
        self.clock = clock
        self.records = records
        self.rounds_records = RoundRecords(sinks)
        self.timeline = self.rounds_records.timeline
        self.listeners = self.rounds_records.listeners
        record = self.rounds_records.hold if records else _drop
        notices = Notices(self.target)
        named: Channel[EngineProfile] = Channel("engine-named")
        connection = connection or connection_for(settings)
        self.prober = Prober(
            settings, session, clock, notices, record, named, connection, gpu, wire
        )
        known = None if self.prober.detecting else self.prober.profile
        self.judge = Judge(
            settings.detector,
            known,
            clock,
            notices,
            record,
            stuck or Channel("requests-stuck"),
            observed or Channel("observed"),
        )
        named.subscribe(self.judge.on_named)
        self.rounds = 0

    async def tick(self) -> list[Transition]:
        """One probe round: every probe concurrently, then judge in time order."""
        changes = self.judge.judge(await self.prober.round(self.judge.fed_t))
        self.rounds_records.publish()
        if self.judge.canary_due():
            self.prober.send_canary()
        self.rounds += 1
        return changes

    def close(self) -> None:
        self.prober.close()

    # -- what the run loop and the reports read -----------------------------------------------

    @property
    def verdicts(self) -> dict[str, Verdict]:
        return self.judge.verdicts

    @property
    def woken(self) -> asyncio.Event:
        return self.prober.woken

    @property
    def last_scrape(self) -> ScrapeObs | None:
        return self.prober.last_scrape

    @property
    def gpu(self) -> GpuProbe | None:
        return self.prober.gpu

    @property
    def canary(self) -> Canary:
        return self.prober.canary

    # -- what the recovery actions may know of the engine (recovery.actions.EngineHandle) ---

    @property
    def connection(self) -> EngineConnection:
        """Where the probes and the actions connect, with which TLS trust and credential."""
        return self.prober.connection

    @property
    def profile(self) -> EngineProfile:
        return self.prober.profile

    def known_request_ids(self) -> list[str]:
        return sorted(self.prober.canary.pending)

    def recent_records(self) -> list[dict[str, Any]]:
        return list(self.timeline)

    def sees_processes(self) -> bool:
        recent = list(self.timeline)[-20:]
        return any(r.get("kind") == "procs" and r.get("procs") for r in recent)

    async def find_procs(self) -> tuple[ProcInfo, ...]:
        pids = self.settings.probe.pids
        obs = await sample_procs_async(None if pids else self.target, pids, profile=self.profile)
        return obs.procs

    def note(self, rec: dict[str, Any]) -> None:
        """A record for the incident timeline and the trace (what the guard did to a request),
        published with the next round; replay ignores its kind."""
        if self.records:
            self.rounds_records.hold({"v": 1, "t": self.clock(), **rec})

    def note_restart(self, detail: str, replaced: bool = False) -> None:
        """The watchdog just ended the engine so that it restarts (``replaced``: and already
        started the next one); judged with the next round (so its transitions reach the
        reporters like any other), and recorded in the trace."""
        self.judge.note_restart(detail, replaced)


def _drop(rec: dict[str, Any]) -> None:
    """The record sink of a watcher that keeps no records (``check``)."""
