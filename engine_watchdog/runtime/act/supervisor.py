"""The only place that decides what to do about a verdict: the escalation ladder.

answer (the guard ends every request in flight with an error and refuses new ones) -> capture
-> abort (then --abort-grace for progress to resume) -> restart (rate-limited, with
backoff, the history on disk) -> liveness (/livez 503). Which rungs run is configuration; their
order is fixed. Nothing acts during start-up grace, on a sleeping, paused or merely unreachable
engine, or on any verdict but stalled; --dry-run logs every action and takes none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from engine_watchdog.core.model import (
    Action,
    Cause,
    Outcome,
    Result,
    State,
    StuckRequest,
    Transition,
    Verdict,
    incident_id,
)
from engine_watchdog.core.settings import PolicySettings
from engine_watchdog.guard.answers import MESSAGES, Ending
from engine_watchdog.host.logs import bind
from engine_watchdog.recovery.history import ActionHistory
from engine_watchdog.recovery.supervise import EngineExited
from engine_watchdog.runtime.act.hands import Actions, GuardControl, refusal
from engine_watchdog.runtime.act.ledger import ActionListener, Ledger
from engine_watchdog.runtime.events import Channel, RequestsStuck, StuckHandled, StuckResult

__all__ = ["ActionListener", "Actions", "GuardControl", "GuardOrders", "Supervisor", "refusal"]
log = logging.getLogger("engine_watchdog.actions")
ANSWER_WAIT_S = 0.5
"""How long the answer rung waits for the hold-back checks (the engine paused on purpose)."""
EXIT_RETRY_S = 5.0
"""How often a rate-limited restart after an exit asks the rate limit again."""


@dataclass(frozen=True)
class GuardOrders:
    """The guard in front of the engine, as the supervisor's hands (it decides, they carry out)."""

    guard: GuardControl
    request_action: str = "abort"
    """abort or report (GuardSettings.request_action)."""
    handled: Channel[StuckHandled] = field(default_factory=lambda: Channel("stuck-handled"))
    """Told what became of each stuck request (the records: the incident timeline, the trace)."""


class Supervisor:
    """A Reporter: sees every probe round's verdicts; runs one incident at a time. Every restart
    goes through it, whoever asks: a stall's ladder, or the supervised engine's own exit."""

    def __init__(
        self,
        policy: PolicySettings,
        actions: Actions,
        history: ActionHistory,
        listeners: list[ActionListener] | None = None,
        clock: Callable[[], float] = time.time,
        *,
        target: str = "",
        orders: GuardOrders | None = None,
        exits: Channel[EngineExited] | None = None,
        stuck: Channel[RequestsStuck] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: wall time, for the history; ``monotonic``: for the waits (both injected,
        so that the policy tests run on their own time)."""
        self.policy = policy
        self.actions = actions
        self.history = history
        self.listeners = listeners if listeners is not None else []
        self.clock = clock
        self.ledger = Ledger(history, self.listeners, clock, policy.dry_run)
        self.monotonic = monotonic
        self.liveness_failed = False
        self.restart_limited = False
        self._refusal_said = False
        """A refusal by the rate limit is recorded once until a restart is allowed again: an
        exit and a verdict (engine-dead) both asking for one are one refusal."""
        self.incident: asyncio.Task[None] | None = None
        self.exit_task: asyncio.Task[None] | None = None
        """The restart after the engine's own exit, while it is decided or waits."""
        self._verdicts: dict[str, Verdict] = {}
        self._changed = asyncio.Event()
        self._target = target
        self.guard = orders.guard if orders else None
        self.request_action = orders.request_action if orders else "abort"
        self.handled: Channel[StuckHandled] = orders.handled if orders else Channel("stuck-handled")
        self._answered = False
        self._restarting = asyncio.Lock()
        """One restart decision at a time, whoever asks (the ladder, an exit)."""
        if exits is not None:
            exits.subscribe(self.on_exit)
        if stuck is not None:
            stuck.subscribe(lambda event: self.on_stuck(list(event.findings)))

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        self._target, self._verdicts = target, verdicts
        self._changed.set()
        stalled = [v for v in verdicts.values() if v.state is State.STALLED]
        if self._recovered():
            self._answered = False  # the incident's clients were answered; new ones pass
        self._gate()
        if stalled:
            self._start_incident(stalled[0])

    def on_stuck(self, findings: list[StuckRequest]) -> None:
        """The request judge's findings: abort each (--request-action abort, not --dry-run),
        log it, count it, note it in the timeline; a burst is an incident."""
        for f in findings:
            result = self._stuck(f)
            log.warning(
                "request %s stuck: %s; %s", f.request_id, f.evidence, result.replace("-", " ")
            )
            self.handled.publish(StuckHandled(f.request_id, result, f.silent_s, f.threshold_s))
            if f.burst:
                evidence = (f"several requests stuck while the engine served others: {f.evidence}",)
                self._start_incident(
                    Verdict(f.t, "-", State.STALLED, Cause.STUCK_REQUESTS, evidence=evidence)
                )

    def _start_incident(self, verdict: Verdict) -> None:
        """The one place an incident starts: one at a time, and a bug in it said at once."""
        if not self.policy.actions or (self.incident is not None and not self.incident.done()):
            return
        self.incident = asyncio.create_task(self._incident(verdict), name="incident")
        self.incident.add_done_callback(_say_if_failed)

    def _stuck(self, f: StuckRequest) -> StuckResult:
        if self.guard is None:
            return "not aborted (no guard)"
        self.guard.count_stuck()
        if self.request_action != "abort":
            return "reported"
        if self.policy.dry_run:
            return "dry-run: would abort"
        ended = self.guard.end(f.request_id, MESSAGES[Ending.STUCK].format(silent=f.silent_s))
        return "aborted" if ended else "already gone"

    def _gate(self) -> None:
        """New requests through the guard: refused (503) while the engine is stalled and its
        clients were answered, restarting, or not listening; passed otherwise."""
        if self.guard is None or Action.ANSWER not in self.policy.actions or self.policy.dry_run:
            return
        self.guard.refuse(refusal(self._verdicts.values(), self._answered))

    # -- the ladder --------------------------------------------------------------------------

    async def _incident(self, verdict: Verdict) -> None:
        # This task's own log context: every line of the ladder names the incident.
        bind(engine=verdict.engine, state=verdict.state.value, cause=verdict.cause)
        bind(incident=incident_id(verdict))
        log.warning("incident: engine %s stalled (%s)", verdict.engine, verdict.cause)
        rungs = self.policy.actions
        if verdict.cause is Cause.STUCK_REQUESTS:
            # The engine serves the others: evidence for its maintainers, nothing that would
            # end the healthy streams with the stuck ones.
            if Action.CAPTURE in rungs:
                await self._act(Action.CAPTURE, self.actions.capture(verdict, destructive=False))
            return
        hold_back = asyncio.create_task(self._hold_back(verdict), name="hold-back")
        if Action.ANSWER in rungs and self.guard is not None:
            # Clients wait for nothing: a paused engine answers /is_paused at once, a hung one
            # never (its loop holds the answer), so a short wait tells them apart.
            await asyncio.wait({hold_back}, timeout=ANSWER_WAIT_S)
            if not (hold_back.done() and hold_back.result()):
                await self._act(Action.ANSWER, self._answer(verdict))
        if await hold_back:
            await self._wait_for(self._recovered, None)
            return
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
        if self.exit_task is not None and not self.exit_task.done():
            log.warning("restart: the engine's exit is being handled already; not asked twice")
            return False
        async with self._restarting:
            allowed, why = self._allowed()
            if not allowed:
                await self._refused(why)
                return False
            if Action.CAPTURE in self.policy.actions and verdict.cause != Cause.ENGINE_DEAD:
                # The CUDA core dump kills the process, so it belongs here and nowhere earlier.
                await self._act(Action.CAPTURE, self.actions.capture(verdict, destructive=True))
            done = await self._act(Action.RESTART, self.actions.restart(verdict.since or verdict.t))
        if done.result not in (Result.OK, Result.SKIPPED):
            return False  # failed, or a dry run: nothing will come back
        back = await self._wait_for(self._back, self.policy.recover_timeout_s)
        log.warning("engine %s after restart", "back" if back else "NOT back")
        return back

    def _allowed(self) -> tuple[bool, str]:
        allowed, why = self.history.restart_allowed(
            self._target, self.clock(), self.policy.rate_limit
        )
        self.restart_limited = not allowed
        if allowed:
            self._refusal_said = False
        return allowed, why

    async def _refused(self, why: str) -> None:
        if not self._refusal_said:
            self._refusal_said = True
            await self._act(Action.RESTART, self._noop(why, Result.RATE_LIMITED))

    def on_exit(self, event: EngineExited) -> None:
        """The supervised engine ended by itself: restart it, under the one rate limit."""
        if self.exit_task is None or self.exit_task.done():
            self.exit_task = asyncio.create_task(self._after_exit(event), name="engine-exit")
            self.exit_task.add_done_callback(_say_if_failed)

    async def _after_exit(self, event: EngineExited) -> None:
        """A restart refused by the rate limit is recorded once; it waits for the limit to
        allow it (a backoff ends, the window passes) and then restarts."""
        while True:
            async with self._restarting:
                allowed, why = self._allowed()
                if allowed:
                    await self._act(Action.RESTART, self._restart_exited(event))
                    return
                await self._refused(why)
            await asyncio.sleep(EXIT_RETRY_S)

    async def _restart_exited(self, event: EngineExited) -> Outcome:
        done = await self.actions.restart(event.t)
        return Outcome(done.result, f"engine exited ({event.returncode}); {done.detail}")

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

    async def _act(self, action: Action, job: Coroutine[Any, Any, Outcome]) -> Outcome:
        return await self.ledger.run(self._target, action, job)

    async def _answer(self, verdict: Verdict) -> Outcome:
        assert self.guard is not None
        self._answered = True
        message = MESSAGES[Ending.STALL].format(cause=verdict.cause or Cause.NO_PROGRESS)
        self._gate()
        ended = self.guard.end_all(message)
        return Outcome(Result.OK, f"{ended} request(s) in flight answered; new ones get 503")

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
        deadline = None if timeout_s is None else self.monotonic() + timeout_s
        while not condition():
            self._changed.clear()
            left = None if deadline is None else deadline - self.monotonic()
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
