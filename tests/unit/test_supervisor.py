"""The escalation ladder's policy, against scripted actions (the real ones run in integration)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine_watchdog.core.model import Cause, Outcome, Result, State, Verdict
from engine_watchdog.core.settings import PolicySettings, RateLimit
from engine_watchdog.recovery.history import ActionHistory
from engine_watchdog.runtime.act.supervisor import Supervisor
from tests.waiting import eventually

T = 1_796_000_000.0


class ScriptedActions:
    """Records what the ladder asked for; abort/restart results are scripted."""

    def __init__(self, abort: str = "ok", restart: str = "ok", paused: bool = False) -> None:
        self.calls: list[str] = []
        self._abort, self._restart, self._paused = abort, restart, paused
        self.remote = False

    async def capture(self, verdict: Verdict, destructive: bool) -> Outcome:
        self.calls.append("capture-destructive" if destructive else "capture")
        return Outcome(Result.OK, "bundle")

    async def abort(self) -> Outcome:
        self.calls.append("abort")
        return Outcome(Result(self._abort))

    async def restart(self, stalled_since: float) -> Outcome:
        self.calls.append("restart")
        return Outcome(Result(self._restart))

    async def paused(self) -> bool:
        return self._paused

    def same_host(self) -> bool:
        return not self.remote


def verdicts(state: State, cause: str | None = None) -> dict[str, Verdict]:
    return {"0": Verdict(T, "0", state, None if cause is None else Cause(cause))}


def supervisor(scripted: ScriptedActions, tmp: Path, **policy: object) -> Supervisor:
    settings = PolicySettings(
        **{"actions": frozenset({"capture", "abort", "restart"}), "abort_grace_s": 0.2, **policy}  # type: ignore[arg-type]
    )
    return Supervisor(settings, scripted, ActionHistory(tmp / "actions.jsonl"), clock=lambda: T)


async def finish(sup: Supervisor, then: dict[str, Verdict] | None = None) -> None:
    """Let the incident run; feed ``then`` (e.g. the engine back) once it waits."""
    for _ in range(50):
        await asyncio.sleep(0.02)
        if then is not None:
            sup.report("t", [], then)
    assert sup.incident is not None
    await asyncio.wait_for(sup.incident, 5)


async def test_ladder_runs_in_order_and_stops_once_the_engine_is_back(tmp_path: Path) -> None:
    actions = ScriptedActions()
    sup = supervisor(actions, tmp_path)
    sup.report("t", [], verdicts(State.STALLED, "no-progress"))
    # The abort grace passes with the engine still stalled: the restart's capture begins.
    await eventually(lambda: "capture-destructive" in actions.calls, timeout=10, what="restart")
    sup.report("t", [], verdicts(State.IDLE))
    await finish(sup)
    # The CUDA core dump kills the process: its (destructive) capture comes with the restart.
    assert actions.calls == ["capture", "abort", "capture-destructive", "restart"]


async def test_abort_that_frees_the_engine_ends_the_incident(tmp_path: Path) -> None:
    actions = ScriptedActions()
    sup = supervisor(actions, tmp_path, abort_grace_s=5.0)
    sup.report("t", [], verdicts(State.STALLED, "no-progress"))
    await finish(sup, then=verdicts(State.PROGRESSING))
    assert actions.calls == ["capture", "abort"]


async def test_dry_run_takes_no_action(tmp_path: Path) -> None:
    actions = ScriptedActions()
    sup = supervisor(actions, tmp_path, dry_run=True)
    sup.report("t", [], verdicts(State.STALLED, "no-progress"))
    await finish(sup, then=verdicts(State.IDLE))
    assert actions.calls == []
    results = [(r.action, r.result) for r in sup.history.records]
    assert results == [
        ("capture", "dry_run"),
        ("abort", "dry_run"),
        ("capture", "dry_run"),
        ("restart", "dry_run"),
    ]


async def test_no_action_on_anything_but_stalled(tmp_path: Path) -> None:
    actions = ScriptedActions()
    sup = supervisor(actions, tmp_path)
    for state in (State.SUSPECT, State.UNREACHABLE, State.SLEEPING, State.STARTING):
        sup.report("t", [], verdicts(state, "no-progress"))
    await asyncio.sleep(0.05)
    assert sup.incident is None and actions.calls == []


async def test_paused_engine_and_remote_api_unresponsive_are_left_alone(tmp_path: Path) -> None:
    paused = ScriptedActions(paused=True)
    sup = supervisor(paused, tmp_path)
    sup.report("t", [], verdicts(State.STALLED, "no-progress"))
    await finish(sup, then=verdicts(State.IDLE))
    remote = ScriptedActions()
    remote.remote = True
    sup = supervisor(remote, tmp_path)
    sup.report("t", [], verdicts(State.STALLED, "api-unresponsive"))
    await finish(sup, then=verdicts(State.IDLE))
    assert paused.calls == [] and remote.calls == []


async def test_restart_limit_survives_a_watchdog_restart(tmp_path: Path) -> None:
    limit = RateLimit(max_restarts=2, window_s=3600, backoff_s=0)
    for _ in range(2):  # two watchdog lives, one restart each
        actions = ScriptedActions(abort="not-available")
        sup = supervisor(actions, tmp_path, rate_limit=limit)
        sup.report("t", [], verdicts(State.STALLED, "no-progress"))
        await finish(sup, then=verdicts(State.IDLE))
        assert "restart" in actions.calls
    third = ScriptedActions(abort="not-available")
    sup = supervisor(third, tmp_path, rate_limit=limit)
    sup.report("t", [], verdicts(State.STALLED, "no-progress"))
    await finish(sup, then=verdicts(State.IDLE))
    assert "restart" not in third.calls and sup.restart_limited
    assert sup.history.records[-1].result == "rate_limited"


async def test_an_exit_and_a_verdict_refused_together_are_one_record(tmp_path: Path) -> None:
    """A crashed supervised engine is seen twice, as its exit and as an engine-dead verdict:
    when the rate limit refuses the restart, the history says so once, not once per asker."""
    from engine_watchdog.recovery.supervise import EngineExited

    limit = RateLimit(max_restarts=0, window_s=3600, backoff_s=0)
    sup = supervisor(ScriptedActions(), tmp_path, actions=frozenset({"restart"}), rate_limit=limit)
    sup.report("t", [], verdicts(State.STALLED, "engine-dead"))
    await eventually(lambda: sup.history.records, timeout=5, what="the refusal")
    sup.on_exit(EngineExited(T, 1, 1))
    assert sup.exit_task is not None
    await asyncio.sleep(0.1)  # the exit's task has asked the limit, and waits for it
    assert not sup.exit_task.done()
    sup.exit_task.cancel()
    await finish(sup, then=verdicts(State.IDLE))
    assert [(r.action, r.result) for r in sup.history.records] == [("restart", "rate_limited")]


def test_backoff_between_restarts(tmp_path: Path) -> None:
    history = ActionHistory(tmp_path / "h.jsonl")
    limit = RateLimit(max_restarts=5, window_s=3600, backoff_s=30)
    from engine_watchdog.recovery.history import ActionRecord

    history.add(ActionRecord(T, "t", "restart", "ok"))
    history.add(ActionRecord(T + 40, "t", "restart", "ok"))
    assert history.restart_allowed("t", T + 60, limit)[0] is False  # 2nd: wait 60 s after it
    assert history.restart_allowed("t", T + 101, limit)[0] is True
    assert history.restart_allowed("other", T + 41, limit)[0] is True


async def test_liveness_rung_fails_livez_until_the_engine_recovers(tmp_path: Path) -> None:
    actions = ScriptedActions()
    sup = supervisor(actions, tmp_path, actions=frozenset({"liveness"}))
    sup.report("t", [], verdicts(State.STALLED, "no-progress"))
    await asyncio.sleep(0.1)
    assert sup.liveness_failed
    await finish(sup, then=verdicts(State.IDLE))
    assert not sup.liveness_failed
