"""The only place that decides what to do about a verdict: the escalation ladder.

capture -> abort (then --abort-grace for progress to resume) -> restart (rate-limited, with
backoff, the history on disk) -> liveness (/livez 503). Which rungs run is configuration; their
order is fixed. Nothing acts during start-up grace, on a sleeping, paused or merely unreachable
engine, or on any verdict but stalled; --dry-run logs every action and takes none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from engine_watchdog.core.model import Action, Cause, Outcome, Result, State, Transition, Verdict
from engine_watchdog.core.settings import PolicySettings
from engine_watchdog.recovery.history import ActionHistory, ActionRecord

log = logging.getLogger("engine_watchdog.actions")


class Actions(Protocol):
    """What the ladder can do to an engine (recovery/actions.py; fakes in policy tests)."""

    async def capture(self, verdict: Verdict, destructive: bool) -> Outcome: ...
    async def abort(self) -> Outcome: ...
    async def restart(self, stalled_since: float) -> Outcome:
        """End the engine that has been stalled since ``stalled_since`` (not a newer one)."""
        ...

    async def paused(self) -> bool: ...
    def same_host(self) -> bool: ...


ActionListener = Callable[[str, Action, str, Outcome | None], None]
"""(target, action, phase "start"|"end", outcome) -> None: metrics, alerts."""


class Supervisor:
    """A Reporter: sees every probe round's verdicts; runs one incident at a time."""

    def __init__(
        self,
        policy: PolicySettings,
        actions: Actions,
        history: ActionHistory,
        listeners: list[ActionListener] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.actions = actions
        self.history = history
        self.listeners = listeners or []
        self.clock = clock
        self.liveness_failed = False
        self.restart_limited = False
        self.incident: asyncio.Task[None] | None = None
        self._verdicts: dict[str, Verdict] = {}
        self._changed = asyncio.Event()
        self._target = ""

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        self._target, self._verdicts = target, verdicts
        self._changed.set()
        stalled = [v for v in verdicts.values() if v.state is State.STALLED]
        if stalled and self.policy.actions and (self.incident is None or self.incident.done()):
            self.incident = asyncio.create_task(self._incident(stalled[0]), name="incident")
            self.incident.add_done_callback(_say_if_failed)

    # -- the ladder --------------------------------------------------------------------------

    async def _incident(self, verdict: Verdict) -> None:
        log.warning("incident: engine %s stalled (%s)", verdict.engine, verdict.cause)
        if await self._hold_back(verdict):
            await self._wait_for(self._recovered, None)
            return
        rungs = self.policy.actions
        if Action.CAPTURE in rungs:
            await self._act(Action.CAPTURE, self.actions.capture(verdict, destructive=False))
        if Action.ABORT in rungs and verdict.cause != Cause.ENGINE_DEAD:
            done = await self._act(Action.ABORT, self.actions.abort())
            if done.result == Result.OK and await self._wait_for(
                self._recovered, self.policy.abort_grace_s
            ):
                log.warning("incident resolved by abort")
                return
        if Action.RESTART in rungs and await self._restart(verdict):
            return
        if Action.LIVENESS in rungs:
            self.liveness_failed = True
            await self._act(Action.LIVENESS, self._noop("/livez now answers 503"))
        await self._wait_for(self._recovered, None)
        self.liveness_failed = False

    async def _restart(self, verdict: Verdict) -> bool:
        """Restart when the rate limit allows; True once the engine is seen back."""
        allowed, why = self.history.restart_allowed(
            self._target, self.clock(), self.policy.rate_limit
        )
        if not allowed:
            self.restart_limited = True
            await self._act(Action.RESTART, self._noop(why, Result.RATE_LIMITED))
            return False
        self.restart_limited = False
        if Action.CAPTURE in self.policy.actions and verdict.cause != Cause.ENGINE_DEAD:
            # The CUDA core dump kills the process, so it belongs here and nowhere earlier.
            await self._act(Action.CAPTURE, self.actions.capture(verdict, destructive=True))
        done = await self._act(Action.RESTART, self.actions.restart(verdict.since or verdict.t))
        if done.result not in (Result.OK, Result.SKIPPED):
            return False  # failed, or a dry run: nothing will come back
        back = await self._wait_for(self._back, self.policy.recover_timeout_s)
        log.warning("engine %s after restart", "back" if back else "NOT back")
        return back

    async def _hold_back(self, verdict: Verdict) -> bool:
        """Reasons not to touch the engine at all."""
        if verdict.cause == Cause.API_UNRESPONSIVE and not self.actions.same_host():
            log.warning("not acting: api-unresponsive on a remote target may be a network split")
            return True
        if await self.actions.paused():
            log.warning("not acting: the engine is paused on purpose")
            return True
        return False

    # -- helpers -----------------------------------------------------------------------------

    async def _act(self, action: Action, job: object) -> Outcome:
        for listener in self.listeners:
            listener(self._target, action, "start", None)
        if self.policy.dry_run:
            close = getattr(job, "close", None)
            if close:
                close()  # the coroutine is never awaited: no action is taken
            outcome = Outcome(Result.DRY_RUN, f"would {action}")
        else:
            assert asyncio.iscoroutine(job)
            try:
                outcome = await job
            except Exception as exc:  # a bug in one action must not end the ladder unrecorded
                log.error("action %s raised %r", action, exc)
                outcome = Outcome(Result.FAILED, f"{type(exc).__name__}: {exc}")
        log.warning("action %s: %s %s", action, outcome.result, outcome.detail)
        # Never raises (a full disk): the record still counts in memory, the ladder goes on.
        self.history.add(
            ActionRecord(self.clock(), self._target, action, outcome.result, outcome.detail)
        )
        for listener in self.listeners:
            listener(self._target, action, "end", outcome)
        return outcome

    @staticmethod
    async def _noop(detail: str, result: Result = Result.OK) -> Outcome:
        return Outcome(result, detail)

    def _recovered(self) -> bool:
        states = {v.state for v in self._verdicts.values()}
        return State.STALLED not in states and bool(states & {State.PROGRESSING, State.IDLE})

    def _back(self) -> bool:
        """Seen again after a restart: reachable and judged anything but stalled."""
        return self._recovered()

    async def _wait_for(self, condition: Callable[[], bool], timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not condition():
            self._changed.clear()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                return condition()
        return True


def _say_if_failed(task: asyncio.Task[None]) -> None:
    """An incident that died of a bug says so at once, in one line (not "Task exception was
    never retrieved" at garbage collection); the next stalled round starts a new one."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("incident handling failed: %r; the next stalled round starts it again", exc)
