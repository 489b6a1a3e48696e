"""The watched engine as the recovery actions know it (recovery.actions.EngineHandle).

Recovery never probes and never reads the probes' state: this view keeps what the actions may
know, from the typed events of the engine's bus (runtime/events.py). The engine's profile comes
from the prober's ``named`` event, whether its processes are seen here from the judged process
samples (``observed``); a restart the actions made goes out as ``restarted``. The timeline the
bundle gets is read as evidence, never to decide.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aiohttp

from engine_watchdog.core.model import Observation, ProcInfo, ProcsObs
from engine_watchdog.core.settings import WatchSettings
from engine_watchdog.engines import PROFILES, VLLM
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.probes.procs import sample_procs_async
from engine_watchdog.runtime.events import Bus, Restarted

PROCS_SEEN_SAMPLES = 8
"""How many of the latest process samples may say whether the engine's processes are seen here
(about the rounds that the last 20 timeline records spanned, what was read before)."""


class EngineView:
    """What the actions know of one engine, and the one thing they tell about it (a restart)."""

    def __init__(
        self,
        settings: WatchSettings,
        session: aiohttp.ClientSession,
        connection: EngineConnection,
        bus: Bus,
        canaries: Callable[[], Iterable[str]],
        timeline: Sequence[dict[str, Any]],
    ) -> None:
        """``canaries``: the engine-side ids of the canaries in flight (the prober's);
        ``timeline``: the recorded last minutes (runtime/trace/recording.py), for the bundle."""
        self.target = settings.url
        self.connection, self.session = connection, session
        self.profile: EngineProfile = PROFILES.get(settings.engine, VLLM)
        """The engine's profile ("--engine auto" resolved once the prober names it)."""
        self._pids = settings.probe.pids
        self._canaries, self._timeline, self._restarted = canaries, timeline, bus.restarted
        self._procs_seen: deque[bool] = deque(maxlen=PROCS_SEEN_SAMPLES)
        bus.named.subscribe(self._on_named)
        bus.observed.subscribe(self._on_observed)

    def known_request_ids(self) -> list[str]:
        return sorted(self._canaries())

    def recent_records(self) -> list[dict[str, Any]]:
        return list(self._timeline)

    def sees_processes(self) -> bool:
        return any(self._procs_seen)

    async def find_procs(self) -> tuple[ProcInfo, ...]:
        pids = self._pids
        obs = await sample_procs_async(None if pids else self.target, pids, profile=self.profile)
        return obs.procs

    def note_restart(self, detail: str, replaced: bool = False) -> None:
        self._restarted.publish(Restarted(detail, replaced))

    def _on_named(self, profile: EngineProfile) -> None:
        self.profile = profile

    def _on_observed(self, obs: Observation) -> None:
        if isinstance(obs, ProcsObs):
            self._procs_seen.append(bool(obs.procs))
