"""The in-process bus between the runtime's parts: one typed channel per kind of event.

The parts (probing, judging, acting, recording, the reporters) never hold each other; they are
handed the channels they publish to and subscribe to when they are built, and :class:`Bus`
names every channel of one watched engine, who publishes on it and who listens. The trace's
dicts are a record of what happened, not this bus: nothing reads them back to decide.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from engine_watchdog.core.model import Observation, StuckRequest
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.recovery.supervise import EngineExited

log = logging.getLogger(__name__)
E = TypeVar("E")


class Channel(Generic[E]):
    """Publish an event to every subscriber, in the order they subscribed, synchronously.

    A subscriber that raises is logged and the others still hear the event: one broken
    reporter must not blind the supervisor."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: list[Callable[[E], None]] = []

    def subscribe(self, subscriber: Callable[[E], None]) -> None:
        self._subscribers.append(subscriber)

    def publish(self, event: E) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:  # a bug in one listener: said, and the others go on
                log.exception("%s: a subscriber failed", self.name)


@dataclass(frozen=True)
class RequestsStuck:
    """The request judge's findings of one round (core/requests.py)."""

    findings: tuple[StuckRequest, ...]


@dataclass(frozen=True)
class Restarted:
    """The watchdog ended the engine so that it restarts (recovery/actions.py): what follows
    is judged as a start-up, not a death."""

    detail: str
    replaced: bool = False
    """The next engine was already started (run mode): whatever answers next is it."""


StuckResult = Literal[
    "aborted", "already gone", "reported", "dry-run: would abort", "not aborted (no guard)"
]
"""What became of a stuck request: the guard ended it, it had ended, the policy only reports,
a dry run, or no guard holds it."""


@dataclass(frozen=True)
class StuckHandled:
    """The supervisor's answer to one stuck request, for the incident timeline and the trace."""

    request_id: str
    result: StuckResult
    silent_s: float
    threshold_s: float


def _channel(name: str) -> Callable[[], Channel[E]]:
    return lambda: Channel(name)


@dataclass
class Bus:
    """The channels of one watched engine: who publishes on each, and who listens."""

    named: Channel[EngineProfile] = field(default_factory=_channel("engine-named"))
    """The prober named the engine (--engine auto) -> the judge, the engine view."""
    observed: Channel[Observation] = field(default_factory=_channel("observed"))
    """The judge judged an observation -> the metrics, the engine view, check."""
    stuck: Channel[RequestsStuck] = field(default_factory=_channel("requests-stuck"))
    """The judge found requests stuck -> the supervisor."""
    restarted: Channel[Restarted] = field(default_factory=_channel("restarted"))
    """The actions restarted the engine -> the judge."""
    handled: Channel[StuckHandled] = field(default_factory=_channel("stuck-handled"))
    """The supervisor had the guard handle a stuck request -> the records."""
    exits: Channel[EngineExited] = field(default_factory=_channel("engine-exited"))
    """Run mode's engine ended by itself -> the supervisor."""
