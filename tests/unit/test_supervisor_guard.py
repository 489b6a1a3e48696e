"""The supervisor's orders to the guard: the answer rung, the 503 gate, per-request aborts,
against a recording guard (the real one runs in tests/integration/test_guard_sim.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from engine_watchdog.core.model import Action, Cause, State, StuckRequest
from engine_watchdog.core.settings import PolicySettings
from engine_watchdog.recovery.history import ActionHistory
from engine_watchdog.runtime.act.supervisor import GuardOrders, Supervisor
from engine_watchdog.runtime.events import Channel, StuckHandled
from tests.unit.test_supervisor import ScriptedActions, T, verdicts


class RecordingGuard:
    def __init__(self) -> None:
        self.refusal: str | None = None
        self.ended: list[str] = []
        self.stuck = 0

    def refuse(self, message: str | None) -> None:
        self.refusal = message

    def end(self, request_id: str, message: str) -> bool:
        self.ended.append(request_id)
        return True

    def end_all(self, message: str) -> int:
        self.ended.append("*")
        return 3

    def count_stuck(self) -> None:
        self.stuck += 1


def guarded(
    tmp: Path,
    *rungs: Action,
    request_action: str = "abort",
    handled: Callable[[StuckHandled], None] = lambda event: None,
    **policy: object,
) -> tuple[Supervisor, RecordingGuard]:
    settings = PolicySettings(actions=frozenset(rungs), **policy)  # type: ignore[arg-type]
    guard = RecordingGuard()
    history = ActionHistory(tmp / "a.jsonl")
    channel: Channel[StuckHandled] = Channel("stuck-handled")
    channel.subscribe(handled)
    orders = GuardOrders(guard, request_action, channel)
    sup = Supervisor(settings, ScriptedActions(), history, clock=lambda: T, orders=orders)
    return sup, guard


async def settle(sup: Supervisor) -> None:
    for _ in range(20):
        await asyncio.sleep(0.02)


async def test_a_stall_answers_every_client_and_refuses_until_the_engine_is_back(
    tmp_path: Path,
) -> None:
    sup, guard = guarded(tmp_path, Action.ANSWER)
    sup.report("t", [], verdicts(State.PROGRESSING))
    assert guard.refusal is None
    sup.report("t", [], verdicts(State.STALLED, "stopped"))
    await settle(sup)
    assert guard.ended == ["*"] and guard.refusal and "stalled (stopped)" in guard.refusal
    sup.report("t", [], verdicts(State.STARTING, "restarting"))
    assert guard.refusal and "restarting" in guard.refusal
    sup.report("t", [], verdicts(State.IDLE))
    assert guard.refusal is None
    assert sup.incident is not None
    await asyncio.wait_for(sup.incident, 5)


async def test_without_the_answer_rung_or_in_a_dry_run_nothing_is_touched(tmp_path: Path) -> None:
    for sup, guard in (
        guarded(tmp_path, Action.CAPTURE),
        guarded(tmp_path, Action.ANSWER, Action.CAPTURE, dry_run=True),
    ):
        sup.report("t", [], verdicts(State.STALLED, "stopped"))
        await settle(sup)
        sup.report("t", [], verdicts(State.STARTING, "restarting"))
        assert (guard.ended, guard.refusal) == ([], None)
        sup.report("t", [], verdicts(State.IDLE))


async def test_a_timeout_of_metrics_alone_never_closes_the_gate(tmp_path: Path) -> None:
    sup, guard = guarded(tmp_path, Action.ANSWER)
    sup.report("t", [], verdicts(State.UNREACHABLE, "timeout"))
    assert guard.refusal is None
    sup.report("t", [], verdicts(State.UNREACHABLE, "connection-refused"))
    assert guard.refusal and "not listening" in guard.refusal


def stuck(rid: str, burst: bool = False) -> StuckRequest:
    return StuckRequest(T, rid, 21.0, 20.0, "no event for 21 s", burst)


async def test_stuck_requests_are_aborted_reported_or_left_by_policy(tmp_path: Path) -> None:
    sup, guard = guarded(tmp_path, Action.ANSWER)
    sup.on_stuck([stuck("a")])
    assert (guard.ended, guard.stuck) == (["a"], 1)
    told, told_guard = guarded(tmp_path, Action.ANSWER, request_action="report")
    told.on_stuck([stuck("b")])
    assert (told_guard.ended, told_guard.stuck) == ([], 1)
    dry, dry_guard = guarded(tmp_path, Action.ANSWER, dry_run=True)
    dry.on_stuck([stuck("c")])
    assert (dry_guard.ended, dry_guard.stuck) == ([], 1)


async def test_a_burst_of_stuck_requests_is_an_incident_that_only_captures(tmp_path: Path) -> None:
    notes: list[StuckHandled] = []
    sup, guard = guarded(
        tmp_path, Action.ANSWER, Action.CAPTURE, Action.RESTART, handled=notes.append
    )
    sup.on_stuck([stuck("a", burst=True)])
    assert sup.incident is not None
    await asyncio.wait_for(sup.incident, 5)
    assert sup.actions.calls == ["capture"]  # type: ignore[attr-defined]
    assert guard.ended == ["a"]  # the healthy streams are left alone
    assert notes == [StuckHandled("a", "aborted", 21.0, 20.0)]
    assert Cause.STUCK_REQUESTS.value == "stuck-requests"


async def test_a_burst_incident_that_fails_says_so_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An incident started by stuck requests is watched like one started by a stalled round: a
    bug in it is one error line when it happens, not a late "exception was never retrieved"."""

    def broken(target: str, action: Action, phase: str, outcome: object) -> None:
        if phase == "end":
            raise RuntimeError("a listener's bug")

    policy = PolicySettings(actions=frozenset({Action.ANSWER, Action.CAPTURE}))
    history, orders = ActionHistory(tmp_path / "a.jsonl"), GuardOrders(RecordingGuard())
    sup = Supervisor(policy, ScriptedActions(), history, [broken], clock=lambda: T, orders=orders)
    sup.on_stuck([stuck("a", burst=True)])
    assert sup.incident is not None
    await asyncio.wait({sup.incident}, timeout=5)  # never retrieves its exception
    await asyncio.sleep(0)  # its done callbacks run
    assert "incident handling failed: RuntimeError" in caplog.text
