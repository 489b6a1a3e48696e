"""What the supervisor's decisions are carried out by (its hands), and the guard's gate.

The supervisor decides; recovery/actions.py and the guard carry out, behind these protocols
(fakes stand in for them in the policy tests).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from engine_watchdog.core.model import Cause, Outcome, State, Verdict


class Actions(Protocol):
    """What the ladder can do to an engine (recovery/actions.py; fakes in policy tests)."""

    async def capture(self, verdict: Verdict, destructive: bool) -> Outcome: ...
    async def abort(self) -> Outcome: ...
    async def restart(self, stalled_since: float) -> Outcome:
        """End the engine that has been stalled since ``stalled_since`` (not a newer one)."""
        ...

    async def paused(self) -> bool: ...
    def same_host(self) -> bool: ...


class GuardControl(Protocol):
    """What the supervisor may tell the guard (guard/proxy.py): it carries decisions out."""

    def refuse(self, message: str | None) -> None: ...
    def end(self, request_id: str, message: str) -> bool: ...
    def end_all(self, message: str) -> int: ...
    def count_stuck(self) -> None: ...


def refusal(verdicts: Iterable[Verdict], answered: bool) -> str | None:
    """Why new requests are refused now (the Retry-After answer's message), or None.
    ``answered``: the answer rung ran for an incident the engine has not recovered from."""
    for v in verdicts:
        if v.state is State.STALLED and answered:
            return f"engine-watchdog: the engine is stalled ({v.cause}); retry later or elsewhere"
        if v.state is State.UNREACHABLE and answered:
            return "engine-watchdog: the engine is being recovered; retry later or elsewhere"
        if v.state is State.STARTING and v.cause == Cause.RESTARTING:
            return "engine-watchdog: the engine is restarting; retry later or elsewhere"
        if v.state in (State.STARTING, State.UNREACHABLE) and v.cause in (Cause.REFUSED, Cause.DNS):
            return "engine-watchdog: the engine is not listening; retry later or elsewhere"
    return None
