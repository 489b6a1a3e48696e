"""The in-process bus between the runtime's parts: one typed channel per kind of event.

The parts (probing, judging, the supervisor, the reporters) never hold each other; they are
handed the channels they publish to and subscribe to when they are built. The trace's dicts are
a record of what happened, not this bus: nothing reads them back to decide.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine_watchdog.core.model import StuckRequest

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
