"""One engine's judge: the detector fed in time order, and what it found, told on channels.

It owns the detector and the settings it judges with. Those are derived once per engine
profile (:func:`detector_settings_for`): at start for a named engine, when the prober names it
under ``--engine auto`` (``named``); and each time recorded in the trace, which replay judges
with. A restart the actions made (``restarted``) is judged with the next round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from engine_watchdog.core.detector import Detector
from engine_watchdog.core.model import Observation, RestartObs, Transition, Verdict
from engine_watchdog.core.settings import DetectorSettings
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.runtime.events import Channel, RequestsStuck, Restarted
from engine_watchdog.runtime.trace.format import encode, encode_settings
from engine_watchdog.runtime.watch.notices import Notices
from engine_watchdog.runtime.watch.probing import Record


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
        self._base = settings
        self._clock, self._notices, self._record = clock, notices, record
        self._stuck, self._observed = stuck, observed
        start = settings if profile is None else detector_settings_for(settings, profile)
        self._detector = Detector(start)
        self.fed_t = 0.0
        """The latest time judged: what comes later is judged no earlier."""
        self._noted: list[RestartObs] = []
        self._remember_settings(profile.name if profile else "auto")

    @property
    def verdicts(self) -> dict[str, Verdict]:
        return self._detector.verdicts

    def on_named(self, profile: EngineProfile) -> None:
        """The prober named the engine: judge with its settings from now on."""
        self._detector.judge_with(detector_settings_for(self._base, profile))
        self._remember_settings(profile.name)

    def on_restarted(self, event: Restarted) -> None:
        """The watchdog just ended the engine so that it restarts; judged with the next round
        (so its transitions reach the reporters like any other), and recorded in the trace."""
        self._noted.append(RestartObs(self._clock(), event.detail, event.replaced))

    def judge(self, probed: Iterable[Observation]) -> list[Transition]:
        """A round's observations (and the restarts noted since), in time order."""
        changes: list[Transition] = []
        for obs in sorted([*self._take_noted(), *probed], key=lambda o: o.t):
            changes += self._detector.feed(obs)
            self.fed_t = max(self.fed_t, obs.t)
            self._observed.publish(obs)
        stuck = self._detector.take_stuck()
        if stuck:
            self._stuck.publish(RequestsStuck(tuple(stuck)))
        self._notices.notes(self._detector.notes)
        self._detector.notes.clear()
        return changes

    def canary_due(self) -> bool:
        return self._detector.canary_due(self._clock()) is not None

    def _take_noted(self) -> list[RestartObs]:
        # Never before what the detector has already judged (a canary may have ended later).
        noted = [replace(o, t=max(o.t, self.fed_t)) for o in self._noted]
        self._noted.clear()
        for obs in noted:
            self._record(encode(obs))
        return noted

    def _remember_settings(self, engine: str) -> None:
        """Into the trace: what the detector judges with from now on (replay uses the same)."""
        self._record(encode_settings(self._clock(), engine, self._detector.settings))
