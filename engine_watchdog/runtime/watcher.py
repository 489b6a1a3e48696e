"""One watched engine: probe it, feed the detector, hand the results to the reporters.

The watcher owns no policy. ``tick()`` runs one probe round; the run loop (runner.py) and the
one-shot check (check.py) decide what to do with the verdicts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import aiohttp

from engine_watchdog.core.detector import Detector
from engine_watchdog.core.exposition import filter_body
from engine_watchdog.core.model import (
    CanaryObs,
    GuardObs,
    Observation,
    ProcInfo,
    ProcsObs,
    RestartObs,
    ScrapeObs,
    StuckRequest,
    Transition,
    Verdict,
)
from engine_watchdog.core.settings import WatchSettings
from engine_watchdog.engines import PROFILES, VLLM
from engine_watchdog.engines.detect import detect_profile
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.connection import EngineConnection, connection_for
from engine_watchdog.probes.canary import Canary
from engine_watchdog.probes.engine_procs import ProcsProbe
from engine_watchdog.probes.gpu import GpuProbe, load_nvml
from engine_watchdog.probes.health import probe_health
from engine_watchdog.probes.metrics import parse_scrape, scrape
from engine_watchdog.probes.procs import sample_procs_async
from engine_watchdog.runtime.notices import Notices, warn_blind_spots
from engine_watchdog.runtime.recording import RoundRecords
from engine_watchdog.runtime.trace import encode, encode_scrape, encode_settings

log = logging.getLogger(__name__)


class WireSource(Protocol):
    """The guard, as a probe (guard/proxy.py)."""

    def snapshot(self, t: float) -> GuardObs: ...


class Reporter(Protocol):
    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        """Called after every probe round, with the round's transitions (maybe none)."""


class Watcher:
    """Probes one engine server and judges it."""

    def __init__(
        self,
        settings: WatchSettings,
        session: aiohttp.ClientSession,
        clock: Callable[[], float] = time.time,
        gpu: GpuProbe | None = None,
        records: bool = True,
        connection: EngineConnection | None = None,
    ) -> None:
        """``records``: keep each round's records for the timeline (bundles) and the trace
        writers; a one-shot ``check`` needs neither. ``connection``: the target's one engine
        connection (runtime/assembly.py builds it); built from ``settings`` when not given."""
        self.records = records
        self.settings = settings
        self.target = settings.url
        """The engine as every report names it (credentials redacted)."""
        self.connection = connection or connection_for(settings)
        """Where the probes and the actions connect, with which TLS trust and credential."""
        self.session = session
        self.clock = clock
        self.notices = Notices(self.target)
        # "auto": judged as vLLM until the first answer of /metrics names the engine.
        self.profile = PROFILES.get(settings.engine, VLLM)
        self.detecting = settings.engine == "auto"
        self.detector = Detector(settings.detector)
        self.rounds_records = RoundRecords()
        self.timeline = self.rounds_records.timeline
        self.listeners = self.rounds_records.listeners
        self.wire: WireSource | None = None
        """The guard in front of this engine, if one runs in this process."""
        self.stuck_listeners: list[Callable[[list[StuckRequest]], None]] = []
        """Told each round's stuck requests (the supervisor)."""
        self.rounds = 0
        if not self.detecting:
            warn_blind_spots(settings, self.profile)
            self._adopt(self.profile)
        else:
            self._remember_settings()
        self._fed_t = 0.0
        self.last_scrape: ScrapeObs | None = None
        self.canary = Canary(
            session, self.connection, self.profile, settings.probe.canary_timeout_s, clock
        )
        self._canary_task: asyncio.Task[CanaryObs] | None = None
        self.woken = asyncio.Event()
        """Set when a canary ends: its answer is judged at once, not a round later."""
        self._noted: list[RestartObs] = []
        pids = settings.probe.pids
        self.procs = ProcsProbe(None if pids else self.target, pids, self.profile, clock=clock)
        self.gpu = _gpu_probe(settings, gpu)

    @property
    def verdicts(self) -> dict[str, Verdict]:
        return self.detector.verdicts

    async def tick(self) -> list[Transition]:
        """One probe round: every probe concurrently, then judge in time order."""
        results = await asyncio.gather(*self._probes(), return_exceptions=True)
        probed: list[Observation] = []
        for result in results:
            if isinstance(result, BaseException):
                self.notices.failed(result)
            elif result is not None:
                probed.append(result)
        changes: list[Transition] = []
        for obs in sorted(
            [*self._take_noted(), *self._canary_result(), *probed], key=lambda o: o.t
        ):
            changes += self.detector.feed(obs)
            self._fed_t = max(self._fed_t, obs.t)
        stuck = self.detector.take_stuck()
        if stuck:
            for listener in self.stuck_listeners:
                listener(stuck)
        self.notices.notes(self.detector.notes)
        self.detector.notes.clear()
        self._publish()
        self._maybe_send_canary()
        self.rounds += 1
        return changes

    # -- what the recovery actions may know of the engine (recovery.actions.EngineHandle) ---

    def known_request_ids(self) -> list[str]:
        return sorted(self.canary.pending)

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
        self._remember({"v": 1, "t": self.clock(), **rec})

    def note_restart(self, detail: str, replaced: bool = False) -> None:
        """The watchdog just ended the engine so that it restarts (``replaced``: and already
        started the next one); judged with the next round (so its transitions reach the
        reporters like any other), and recorded in the trace."""
        self._noted.append(RestartObs(self.clock(), detail, replaced))

    def _take_noted(self) -> list[RestartObs]:
        # Never before what the detector has already judged (a canary may have ended later).
        noted = [replace(o, t=max(o.t, self._fed_t)) for o in self._noted]
        self._noted.clear()
        for obs in noted:
            self._remember(encode(obs))
        return noted

    def close(self) -> None:
        if self._canary_task is not None:
            self._canary_task.cancel()
        if self.gpu is not None:
            self.gpu.close()

    def _probes(self) -> list[Any]:
        probe = self.settings.probe
        jobs: list[Any] = [self._scrape()]
        if probe.health and (probe.health_every_round or self._health_wanted()):
            jobs.append(self._health())
        if probe.procs:
            jobs.append(self._procs())
        if self.gpu is not None:
            jobs.append(self._gpu(self.gpu))
        if self.wire is not None:
            jobs.append(self._guard(self.wire))
        return jobs

    def _health_wanted(self) -> bool:
        """In the first round, and while /metrics does not answer (dead or unreachable?)."""
        return self.last_scrape is None or self.last_scrape.error is not None

    async def _guard(self, wire: WireSource) -> Observation:
        obs = wire.snapshot(self.clock())
        self._remember(encode(obs))
        return obs

    async def _scrape(self) -> Observation:
        probe = self.settings.probe
        profile_path = self.profile.metrics_path
        raw = await scrape(
            self.session,
            self.connection.url(self.profile.metrics_path),
            timeout_s=probe.scrape_timeout_s,
            max_bytes=probe.max_scrape_bytes,
            clock=self.clock,
            access=self.connection.access,
        )
        if self.detecting and raw.body is not None:
            detail = self._detect(raw.body, raw.status or 0)
            if detail is not None:  # not named yet: say so, try again next round
                unnamed = replace(raw, body=None, error="no-engine-series", detail=detail)
                self._remember(encode_scrape(unnamed))
                self.last_scrape = ScrapeObs(
                    raw.t, error="no-engine-series", detail=detail, status=raw.status
                )
                return self.last_scrape
            if self.profile.metrics_path != profile_path:
                return await self._scrape()  # e.g. trtllm-serve's Prometheus text lives elsewhere
        obs = parse_scrape(raw, self.profile)
        self.notices.notes(obs.notes)
        if self.records:
            if raw.body is not None:
                # Traces keep only what the profile reads: a few KB instead of hundreds.
                raw = replace(raw, body=filter_body(raw.body, self.profile.wanted_series()))
            self._remember(encode_scrape(raw))
        self.last_scrape = obs
        return obs

    def _adopt(self, profile: EngineProfile) -> None:
        """What the detector must know of the engine (it never sees profiles)."""
        if profile.metrics_in_engine_loop:
            d = self.detector.settings
            self.detector.settings = replace(d, metrics_from_engine_loop=True)
        if profile.health_waits_on_engine and self.settings.probe.health:
            # SGLang's /health runs a generation, TGI's asks every shard: polled every round it
            # is a load of its own, holds the round while the engine hangs, and its failure
            # means "hung or dead", not "dead". The canary covers it.
            log.info("%s: %s's /health waits on the engine: not polled", self.target, profile.name)
            self.settings = replace(self.settings, probe=replace(self.settings.probe, health=False))
        self._remember_settings()

    def _remember_settings(self) -> None:
        """Into the trace: what the detector judges with from now on (replay uses the same)."""
        name = "auto" if self.detecting else self.profile.name
        self._remember(encode_settings(self.clock(), name, self.detector.settings))

    def _detect(self, body: str, status: int) -> str | None:
        """Fix the engine profile from a /metrics answer; the reason when it cannot."""
        found = detect_profile(body, status)
        if found.profile is None:
            return found.message()
        log.info("%s: %s", self.target, found.message())
        self.profile, self.detecting = found.profile, False
        self._adopt(found.profile)
        self.canary.profile = self.procs.profile = found.profile
        warn_blind_spots(self.settings, found.profile)
        return None

    async def _health(self) -> Observation:
        url, access = self.connection.url(self.profile.health_path), self.connection.access
        obs = await probe_health(
            self.session, url, self.settings.probe.scrape_timeout_s, self.clock, access
        )
        self._remember(encode(obs))
        return obs

    async def _procs(self) -> Observation:
        obs: ProcsObs = await asyncio.to_thread(self.procs.sample)
        self._remember(encode(obs))
        return obs

    async def _gpu(self, gpu: GpuProbe) -> Observation | None:
        obs = await asyncio.to_thread(gpu.sample)
        if obs is not None:
            self._remember(encode(obs))
        return obs

    def _canary_result(self) -> list[Observation]:
        task = self._canary_task
        if task is None or not task.done():
            return []
        self._canary_task = None
        if task.cancelled() or self.notices.failed(task.exception()):
            return []
        # It may have ended while the last round's probes ran: judged now, after them, so that
        # time never runs backwards for the detector (nor in the trace).
        obs = replace(task.result(), t=max(task.result().t, self._fed_t))
        self.notices.canary(obs, self.connection.access.api_key is not None)
        self._remember(encode(obs))
        return [obs]

    def _maybe_send_canary(self) -> None:
        """Start a canary in the background when the detector is in doubt (one at a time)."""
        if not self.settings.probe.canary or self._canary_task is not None:
            return
        if self.detector.canary_due(self.clock()) is not None:
            self._canary_task = asyncio.create_task(self.canary.send(), name="canary")
            self._canary_task.add_done_callback(lambda _: self.woken.set())

    def _remember(self, rec: dict[str, Any]) -> None:
        if self.records:
            self.rounds_records.hold(rec)

    def _publish(self) -> None:
        self.rounds_records.publish()


def _gpu_probe(settings: WatchSettings, given: GpuProbe | None) -> GpuProbe | None:
    gpu = given if given is not None else (GpuProbe(load_nvml()) if settings.probe.gpu else None)
    if gpu is not None and (reason := gpu.start()):
        log.info("GPU probe off: %s", reason)
        return None
    return gpu
