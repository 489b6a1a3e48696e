"""What a watcher says about one engine, each thing once: odd values the probes read or the
detector judged, a canary that cannot be used and why, a probe that raised. Once, because
these repeat every round and a log that says the same line every second says nothing."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable

from engine_watchdog.core.model import CanaryObs, Note
from engine_watchdog.core.settings import WatchSettings
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.probes.canary import unusable_hint

log = logging.getLogger("engine_watchdog.runtime.watch.watcher")


class Notices:
    def __init__(self, target: str) -> None:
        self.target = target
        self._said: set[str] = set()

    def once(self, kind: str) -> bool:
        """True the first time ``kind`` is seen for this engine."""
        if kind in self._said:
            return False
        self._said.add(kind)
        return True

    def notes(self, notes: Iterable[Note]) -> None:
        for note in notes:
            if self.once(f"note:{note.kind}"):
                log.warning("%s: %s", self.target, note.text)

    def canary(self, obs: CanaryObs, has_key: bool) -> None:
        hint = unusable_hint(obs.error or "", has_key)
        if hint is not None and self.once(f"canary:{hint[0]}"):
            log.warning("%s: %s", self.target, hint[1])

    def failed(self, result: object) -> bool:
        """True when ``result`` is what a probe raised (a bug: probes turn every answer into an
        observation), said once with its traceback: the round goes on without it, so one odd
        engine cannot end the watch of the others. Cancellation is passed on."""
        if not isinstance(result, BaseException):
            return False
        if not isinstance(result, Exception):
            raise result
        if isinstance(result, OSError) and result.errno in (errno.EMFILE, errno.ENFILE):
            if self.once("probe-raised:no-descriptor"):  # no bug: the process's own limit
                fix = "raise the watchdog's open files limit (ulimit -n)"
                log.error(
                    "%s: a probe failed: no file descriptor left (%s); %s",
                    self.target,
                    result.strerror,
                    fix,
                )
            return True
        if self.once(f"probe-raised:{type(result).__name__}"):
            log.error("%s: a probe failed: %r", self.target, result, exc_info=result)
        return True


def warn_blind_spots(settings: WatchSettings, profile: EngineProfile) -> None:
    """Say once where this engine's metrics cannot carry the verdict with these settings."""
    if profile.progress_needs_canary and not settings.probe.canary:
        log.warning(
            "%s: %s moves its progress series only when a request finishes: with --no-canary "
            "a long healthy generation cannot be told from a hang",
            settings.url,
            profile.name,
        )
    if settings.detector.stall_seconds <= profile.work_gauge_lag_s and not settings.probe.canary:
        log.warning(
            "%s: %s's work gauges can stay stale for %.0f s: keep --stall-seconds above that "
            "or the canary on",
            settings.url,
            profile.name,
            profile.work_gauge_lag_s,
        )
