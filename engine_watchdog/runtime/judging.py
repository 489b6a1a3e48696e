"""One engine's judge: the detector fed in time order, and what it found, told on channels.

It owns the detector and the settings it judges with. Those are derived once per engine
profile (:func:`detector_settings_for`): at start for a named engine, when the prober names it
under ``--engine auto``; and each time recorded in the trace, which replay judges with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from engine_watchdog.core.detector import Detector
from engine_watchdog.core.model import Observation, RestartObs, Transition, Verdict
from engine_watchdog.core.settings import DetectorSettings
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.runtime.events import Channel, RequestsStuck
from engine_watchdog.runtime.notices import Notices
from engine_watchdog.runtime.probing import Record
from engine_watchdog.runtime.trace import encode, encode_settings


def detector_settings_for(settings: DetectorSettings, profile: EngineProfile) -> DetectorSettings:
    """What the detector must know of the engine (it never sees profiles)."""
    if profile.metrics_in_engine_loop:
        return replace(settings, metrics_from_engine_loop=True)
    return settings


class Judge:
    """Feeds one engine's observations to its detector, never one older than the last fed."""

    def __init__(  # every collaborator here, none set later
        self,
        settings: DetectorSettings,
        profile: EngineProfile | None,
        clock: Callable[[], float],
        notices: Notices,
        record: Record,
        stuck: Channel[RequestsStuck],
        observed: Channel[Observation],
    ) -> None:
        """``profile``: the engine's, or None until the prober names it (``--engine auto``)."""
        self.base = settings
        self.clock, self.notices, self.record = clock, notices, record
        self.stuck, self.observed = stuck, observed
        start = settings if profile is None else detector_settings_for(settings, profile)
        self.detector = Detector(start)
        self.fed_t = 0.0
        """The latest time judged: what comes later is judged no earlier."""
        self._noted: list[RestartObs] = []
        self._remember_settings(profile.name if profile else "auto")

    @property
    def verdicts(self) -> dict[str, Verdict]:
        return self.detector.verdicts

    def on_named(self, profile: EngineProfile) -> None:
        """The prober named the engine: judge with its settings from now on."""
        self.detector.judge_with(detector_settings_for(self.base, profile))
        self._remember_settings(profile.name)

    def note_restart(self, detail: str, replaced: bool = False) -> None:
        """The watchdog just ended the engine so that it restarts; judged with the next round."""
        self._noted.append(RestartObs(self.clock(), detail, replaced))

    def judge(self, probed: Iterable[Observation]) -> list[Transition]:
        """A round's observations (and the restarts noted since), in time order."""
        changes: list[Transition] = []
        for obs in sorted([*self._take_noted(), *probed], key=lambda o: o.t):
            changes += self.detector.feed(obs)
            self.fed_t = max(self.fed_t, obs.t)
            self.observed.publish(obs)
        stuck = self.detector.take_stuck()
        if stuck:
            self.stuck.publish(RequestsStuck(tuple(stuck)))
        self.notices.notes(self.detector.notes)
        self.detector.notes.clear()
        return changes

    def canary_due(self) -> bool:
        return self.detector.canary_due(self.clock()) is not None

    def _take_noted(self) -> list[RestartObs]:
        # Never before what the detector has already judged (a canary may have ended later).
        noted = [replace(o, t=max(o.t, self.fed_t)) for o in self._noted]
        self._noted.clear()
        for obs in noted:
            self.record(encode(obs))
        return noted

    def _remember_settings(self, engine: str) -> None:
        """Into the trace: what the detector judges with from now on (replay uses the same)."""
        self.record(encode_settings(self.clock(), engine, self.detector.settings))
