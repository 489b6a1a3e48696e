"""One engine's probe round: every probe concurrently, the canary when the judge asks for one.

The prober reads, never judges: it hands its observations back to whoever runs the round (the
watcher), each recorded for the trace as it is made. It owns what the probes need: the engine's
profile (fixed, or named by the first /metrics answer under ``--engine auto``: then it says so
on ``named``), the canary in flight, the process and GPU probes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import aiohttp

from engine_watchdog.core.exposition import filter_body
from engine_watchdog.core.model import CanaryObs, Cause, GuardObs, Observation, ProcsObs, ScrapeObs
from engine_watchdog.core.settings import WatchSettings
from engine_watchdog.engines import PROFILES, VLLM
from engine_watchdog.engines.detect import detect_profile
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.probes.canary import Canary
from engine_watchdog.probes.engine_procs import ProcsProbe
from engine_watchdog.probes.health import probe_health
from engine_watchdog.probes.nvml import GpuProbe, load_nvml
from engine_watchdog.probes.scrape import parse_scrape, scrape
from engine_watchdog.runtime.events import Channel
from engine_watchdog.runtime.trace.format import encode, encode_scrape
from engine_watchdog.runtime.watch.notices import Notices, warn_blind_spots

log = logging.getLogger(__name__)
Record = Callable[[dict[str, Any]], None]


class WireSource(Protocol):
    """The guard, as a probe (guard/proxy.py)."""

    def snapshot(self, t: float) -> GuardObs: ...


def probe_settings_for(settings: WatchSettings, profile: EngineProfile) -> WatchSettings:
    """The probes' settings for this engine: SGLang's /health runs a generation and TGI's asks
    every shard, so polled every round it is a load of its own, holds the round while the
    engine hangs, and its failure means "hung or dead", not "dead": not polled (the canary
    covers it)."""
    if profile.health_waits_on_engine and settings.probe.health:
        log.info("%s: %s's /health waits on the engine: not polled", settings.url, profile.name)
        return replace(settings, probe=replace(settings.probe, health=False))
    return settings


class Prober:
    """Probes one engine server; each call of :meth:`round` is one probe round."""

    def __init__(  # every collaborator here, none set later
        self,
        settings: WatchSettings,
        session: aiohttp.ClientSession,
        clock: Callable[[], float],
        notices: Notices,
        record: Record,
        named: Channel[EngineProfile],
        connection: EngineConnection,
        gpu: GpuProbe | None = None,
        wire: WireSource | None = None,
    ) -> None:
        self.target = settings.url
        self._connection = connection
        """Where the probes connect, with which TLS trust and credential (runtime/assembly.py)."""
        self._session, self._clock, self._notices = session, clock, notices
        self._record, self._named, self._wire = record, named, wire
        # "auto": probed as vLLM until the first answer of /metrics names the engine.
        self.profile = PROFILES.get(settings.engine, VLLM)
        self.detecting = settings.engine == "auto"
        self.settings = settings if self.detecting else probe_settings_for(settings, self.profile)
        if not self.detecting:
            warn_blind_spots(settings, self.profile)
        probe = settings.probe
        self.canary = Canary(session, connection, probe.canary_timeout_s, clock)
        self._procs_probe = ProcsProbe(None if probe.pids else self.target, probe.pids, clock=clock)
        self.gpu = _gpu_probe(settings, gpu)
        self.last_scrape: ScrapeObs | None = None
        self.woken = asyncio.Event()
        """Set when a canary ends: its answer is judged at once, not a round later."""
        self._canary_task: asyncio.Task[CanaryObs] | None = None

    async def round(self, not_before: float) -> list[Observation]:
        """Every probe concurrently, and the canary that ended since the last round (its time
        no earlier than ``not_before``, what the judge has judged already)."""
        results = await asyncio.gather(*self._probes(), return_exceptions=True)
        probed: list[Observation] = self._canary_result(not_before)
        for result in results:
            if isinstance(result, BaseException):
                self._notices.failed(result)
            elif result is not None:
                probed.append(result)
        return probed

    def send_canary(self) -> None:
        """Start a canary in the background (one at a time; the judge decides when)."""
        if not self.settings.probe.canary or self._canary_task is not None:
            return
        self._canary_task = asyncio.create_task(self.canary.send(self.profile), name="canary")
        self._canary_task.add_done_callback(lambda _: self.woken.set())

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
        if self._wire is not None:
            jobs.append(self._guard(self._wire))
        return jobs

    def _health_wanted(self) -> bool:
        """In the first round, and while /metrics does not answer (dead or unreachable?)."""
        return self.last_scrape is None or self.last_scrape.error is not None

    async def _guard(self, wire: WireSource) -> Observation:
        obs = wire.snapshot(self._clock())
        self._record(encode(obs))
        return obs

    async def _scrape(self) -> Observation:
        probe = self.settings.probe
        profile_path = self.profile.metrics_path
        raw = await scrape(
            self._session,
            self._connection.url(self.profile.metrics_path),
            timeout_s=probe.scrape_timeout_s,
            max_bytes=probe.max_scrape_bytes,
            clock=self._clock,
            access=self._connection.access,
        )
        if self.detecting and raw.body is not None:
            detail = self._detect(raw.body, raw.status or 0)
            if detail is not None:  # not named yet: say so, try again next round
                unnamed = replace(raw, body=None, error=Cause.NO_ENGINE_SERIES, detail=detail)
                self._record(encode_scrape(unnamed))
                self.last_scrape = ScrapeObs(
                    raw.t, error=Cause.NO_ENGINE_SERIES, detail=detail, status=raw.status
                )
                return self.last_scrape
            if self.profile.metrics_path != profile_path:
                return await self._scrape()  # e.g. trtllm-serve's Prometheus text lives elsewhere
        obs = parse_scrape(raw, self.profile)
        self._notices.notes(obs.notes)
        if raw.body is not None:
            # Traces keep only what the profile reads: a few KB instead of hundreds.
            raw = replace(raw, body=filter_body(raw.body, self.profile.wanted_series()))
        self._record(encode_scrape(raw))
        self.last_scrape = obs
        return obs

    def _detect(self, body: str, status: int) -> str | None:
        """Fix the engine profile from a /metrics answer; the reason when it cannot."""
        found = detect_profile(body, status)
        if found.profile is None:
            return found.message()
        log.info("%s: %s", self.target, found.message())
        self.profile, self.detecting = found.profile, False
        self.settings = probe_settings_for(self.settings, found.profile)
        warn_blind_spots(self.settings, found.profile)
        self._named.publish(found.profile)
        return None

    async def _health(self) -> Observation:
        url, access = self._connection.url(self.profile.health_path), self._connection.access
        obs = await probe_health(
            self._session, url, self.settings.probe.scrape_timeout_s, self._clock, access
        )
        self._record(encode(obs))
        return obs

    async def _procs(self) -> Observation:
        obs: ProcsObs = await asyncio.to_thread(self._procs_probe.sample, self.profile)
        self._record(encode(obs))
        return obs

    async def _gpu(self, gpu: GpuProbe) -> Observation | None:
        obs = await asyncio.to_thread(gpu.sample)
        if obs is not None:
            self._record(encode(obs))
        return obs

    def _canary_result(self, not_before: float) -> list[Observation]:
        task = self._canary_task
        if task is None or not task.done():
            return []
        self._canary_task = None
        if task.cancelled() or self._notices.failed(task.exception()):
            return []
        # It may have ended while the last round's probes ran: judged now, after them, so that
        # time never runs backwards for the detector (nor in the trace).
        obs = replace(task.result(), t=max(task.result().t, not_before))
        self._notices.canary(obs, self._connection.access.api_key is not None)
        self._record(encode(obs))
        return [obs]


def _gpu_probe(settings: WatchSettings, given: GpuProbe | None) -> GpuProbe | None:
    gpu = given if given is not None else (GpuProbe(load_nvml()) if settings.probe.gpu else None)
    if gpu is not None and (reason := gpu.start()):
        log.info("GPU probe off: %s", reason)
        return None
    return gpu
