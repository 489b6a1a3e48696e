"""One watched engine: probe it, feed the detector, hand the results to the reporters.

The watcher owns no policy. ``tick()`` runs one probe round; the run loop (runner.py) and the
one-shot check (check.py) decide what to do with the verdicts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import aiohttp

from engine_watchdog.config import WatchSettings
from engine_watchdog.detector import Detector
from engine_watchdog.engines import PROFILES
from engine_watchdog.model import (
    CanaryObs,
    HealthObs,
    Observation,
    ProcsObs,
    ScrapeObs,
    Transition,
    Verdict,
)
from engine_watchdog.probes.canary import Canary
from engine_watchdog.probes.engine_procs import ProcsProbe
from engine_watchdog.probes.exposition import filter_body
from engine_watchdog.probes.gpu import GpuProbe, load_nvml
from engine_watchdog.probes.metrics import error_code, parse_scrape, scrape
from engine_watchdog.trace import encode, encode_scrape

log = logging.getLogger(__name__)
TIMELINE_SECONDS = 600.0
"""How much recorded history an incident bundle gets."""


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
    ) -> None:
        self.settings = settings
        self.session = session
        self.clock = clock
        self.profile = PROFILES[settings.engine]
        self.detector = Detector(settings.detector)
        self.target = settings.url
        self.timeline: deque[dict[str, Any]] = deque()
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self.rounds = 0
        self.last_scrape: ScrapeObs | None = None
        self.canary = Canary(
            session, self.target, self.profile, settings.probe.canary_timeout_s, clock
        )
        self._canary_task: asyncio.Task[CanaryObs] | None = None
        pids = settings.probe.pids
        self.procs = ProcsProbe(None if pids else self.target, pids, self.profile, clock=clock)
        self.gpu = (
            gpu if gpu is not None else (GpuProbe(load_nvml()) if settings.probe.gpu else None)
        )
        if self.gpu is not None and (reason := self.gpu.start()):
            log.info("GPU probe off: %s", reason)
            self.gpu = None

    @property
    def verdicts(self) -> dict[str, Verdict]:
        return self.detector.verdicts

    async def tick(self) -> list[Transition]:
        """One probe round: every probe concurrently, then judge in time order."""
        probed = [o for o in await asyncio.gather(*self._probes()) if o is not None]
        changes: list[Transition] = []
        for obs in sorted([*self._canary_result(), *probed], key=lambda o: o.t):
            changes += self.detector.feed(obs)
        self._maybe_send_canary()
        self.rounds += 1
        return changes

    def close(self) -> None:
        if self._canary_task is not None:
            self._canary_task.cancel()
        if self.gpu is not None:
            self.gpu.close()

    def _probes(self) -> list[Any]:
        probe = self.settings.probe
        jobs: list[Any] = [self._scrape()]
        if probe.health:
            jobs.append(self._health())
        if probe.procs:
            jobs.append(self._procs())
        if self.gpu is not None:
            jobs.append(self._gpu(self.gpu))
        return jobs

    async def _scrape(self) -> Observation:
        probe = self.settings.probe
        raw = await scrape(
            self.session,
            self.target + self.profile.metrics_path,
            timeout_s=probe.scrape_timeout_s,
            max_bytes=probe.max_scrape_bytes,
            clock=self.clock,
        )
        obs = parse_scrape(raw, self.profile)
        if raw.body is not None:
            # Traces keep only what the profile reads: a few KB instead of hundreds.
            raw = replace(raw, body=filter_body(raw.body, self.profile.wanted_series()))
        self._remember(encode_scrape(raw))
        self.last_scrape = obs
        return obs

    async def _health(self) -> Observation:
        t = self.clock()
        timeout = aiohttp.ClientTimeout(total=self.settings.probe.scrape_timeout_s)
        try:
            url = self.target + self.profile.health_path
            async with self.session.get(url, timeout=timeout) as resp:
                await resp.read()
                obs = HealthObs(t, status=resp.status)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            obs = HealthObs(t, status=None, error=error_code(exc))
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
        obs = task.result()
        self._remember(encode(obs))
        return [obs]

    def _maybe_send_canary(self) -> None:
        """Start a canary in the background when the detector is in doubt (one at a time)."""
        if not self.settings.probe.canary or self._canary_task is not None:
            return
        if self.detector.canary_due(self.clock()) is not None:
            self._canary_task = asyncio.create_task(self.canary.send(), name="canary")

    def _remember(self, rec: dict[str, Any]) -> None:
        """Keep the recent timeline (for bundles) and pass the record to trace writers."""
        self.timeline.append(rec)
        while self.timeline and rec["t"] - self.timeline[0]["t"] > TIMELINE_SECONDS:
            self.timeline.popleft()
        for listener in self.listeners:
            listener(rec)
