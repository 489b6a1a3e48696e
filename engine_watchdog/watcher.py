"""One watched engine: probe it, feed the detector, hand the results to the reporters.

The watcher owns no policy. ``tick()`` runs one probe round; the run loop (runner.py) and the
one-shot check (check.py) decide what to do with the verdicts.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import aiohttp

from engine_watchdog.config import WatchSettings
from engine_watchdog.detector import Detector
from engine_watchdog.engines import PROFILES
from engine_watchdog.model import HealthObs, Observation, ScrapeObs, Transition, Verdict
from engine_watchdog.probes.exposition import filter_body
from engine_watchdog.probes.metrics import error_code, parse_scrape, scrape
from engine_watchdog.trace import encode_health, encode_scrape

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

    @property
    def verdicts(self) -> dict[str, Verdict]:
        return self.detector.verdicts

    async def tick(self) -> list[Transition]:
        """One probe round: scrape (and /health) concurrently, then judge in time order."""
        probe = self.settings.probe
        jobs = [self._scrape()]
        if probe.health:
            jobs.append(self._health())
        observations = sorted(await asyncio.gather(*jobs), key=lambda o: o.t)
        changes: list[Transition] = []
        for obs in observations:
            changes += self.detector.feed(obs)
        self.rounds += 1
        return changes

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
        self._remember(encode_health(obs))
        return obs

    def _remember(self, rec: dict[str, Any]) -> None:
        """Keep the recent timeline (for bundles) and pass the record to trace writers."""
        self.timeline.append(rec)
        while self.timeline and rec["t"] - self.timeline[0]["t"] > TIMELINE_SECONDS:
            self.timeline.popleft()
        for listener in self.listeners:
            listener(rec)
