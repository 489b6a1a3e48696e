"""The detector across a restart the watchdog itself made: the ended engine is starting, not
dead, until the next one answers; then it is judged afresh (with its own start-up grace)."""

from __future__ import annotations

from engine_watchdog.core.detector import Detector, DetectorSettings
from engine_watchdog.core.model import (
    Cause,
    HealthObs,
    Observation,
    ProcInfo,
    ProcsObs,
    Reason,
    RestartObs,
    ScrapeObs,
)
from tests.tools.detector_feed import T0, Eng, scrape

API = ProcInfo(pid=10, ppid=1, role="api-server", title="vllm serve", state="sleeping", cpu_s=1)
CORE = ProcInfo(pid=11, ppid=10, role="engine-core", title="VLLM::EngineCore", state="stopped",
                cpu_s=5)  # fmt: skip


def refused(t: float) -> ScrapeObs:
    return ScrapeObs(T0 + t, error=Cause.REFUSED)


def feed(
    obs: list[Observation], restart_grace_seconds: float = 300.0
) -> list[tuple[float, str, Reason | None]]:
    settings = DetectorSettings(
        stall_seconds=10, startup_grace_seconds=5, restart_grace_seconds=restart_grace_seconds
    )
    detector = Detector(settings)
    seen = []
    for o in obs:
        for change in detector.feed(o):
            seen.append((round(change.new.t - T0, 1), change.new.state.value, change.new.cause))
    return seen


def stalled_engine(until: int) -> tuple[Eng, list[Observation]]:
    """An engine with work and frozen counters from t=0: stalled (no-progress) at t=10."""
    e = Eng(running=2, tokens=50)
    return e, [scrape(t, e) for t in range(until)]


def test_a_restart_we_made_is_starting_not_engine_dead() -> None:
    e, obs = stalled_engine(12)
    obs += [RestartObs(T0 + 12, "SIGKILL sent to engine core [11]")]
    # The old API server answers a few seconds more (stale values, /health 503), then goes;
    # the engine core is gone from the process table.
    obs += [scrape(13, e), HealthObs(T0 + 13.5, 503), scrape(14, e)]
    for t in range(15, 40):
        obs += [refused(t), ProcsObs(T0 + t + 0.5, (API,) if t < 16 else ())]
    fresh = Eng(running=0, tokens=0)  # the new engine: counters from zero, idle
    obs += [scrape(t, fresh) for t in range(40, 50)]
    seen = feed(obs)
    assert (10.0, "stalled", "no-progress") in seen
    after = [s for s in seen if s[0] >= 12]
    assert after[0] == (12.0, "starting", "restarting")
    assert ("stalled", "engine-dead") not in [(s, c) for _, s, c in after]
    assert after[-1] == (40.0, "idle", None)


def test_the_old_api_answering_without_its_engine_core_is_still_restarting() -> None:
    """vLLM's API server serves its last values for about 5 s after its engine core died; the
    process table already shows no engine core. That is the restart we made, not a death."""
    e, obs = stalled_engine(12)
    obs += [RestartObs(T0 + 12)]
    for t in range(13, 20):
        obs += [scrape(t, e), HealthObs(T0 + t + 0.2, 503), ProcsObs(T0 + t + 0.5, (API,))]
    obs += [refused(t) for t in range(20, 25)]
    obs += [scrape(t, Eng(running=0, tokens=0)) for t in range(25, 30)]
    seen = feed(obs)
    after = [s for s in seen if s[0] >= 12]
    assert after == [(12.0, "starting", "restarting"), (25.0, "idle", None)], after


def test_an_engine_already_replaced_is_judged_at_its_first_answer() -> None:
    """Supervise mode notes the restart once the next engine runs: its first answer ends the
    restart even when nothing shows a new engine (an idle engine's counters were zero too)."""
    idle = Eng(running=0, tokens=0)
    obs: list[Observation] = [scrape(t, idle) for t in range(12)]
    obs += [RestartObs(T0 + 12, "engine restarted", replaced=True)]
    obs += [scrape(t, idle) for t in range(13, 20)]
    seen = feed(obs)
    assert [s for s in seen if s[0] >= 12] == [
        (12.0, "starting", "restarting"),
        (13.0, "idle", None),
    ]


def test_the_next_engine_gets_its_own_start_up_grace() -> None:
    _, obs = stalled_engine(12)
    obs += [RestartObs(T0 + 12), refused(13)]
    stuck_again = Eng(running=1, tokens=0)  # new, with work, never moving
    obs += [scrape(t, stuck_again) for t in range(14, 40)]
    seen = feed(obs)
    restarted = [s for s in seen if s[0] > 12 and s[1] == "stalled"]
    # Quiet from 14; the grace (5 s) has run out long before the stall window (10 s) ends.
    assert restarted[0] == (24.0, "stalled", "no-progress")


def test_an_engine_that_never_comes_back_is_dead_after_the_restart_grace() -> None:
    _, obs = stalled_engine(12)
    obs += [RestartObs(T0 + 12)]
    obs += [refused(t) for t in range(13, 80)]
    seen = feed(obs, restart_grace_seconds=30)
    assert [s for s in seen if s[0] >= 12][:2] == [
        (12.0, "starting", "restarting"),
        (42.0, "unreachable", "connection-refused"),
    ]


def test_an_old_server_that_keeps_answering_is_judged_again_after_the_grace() -> None:
    """Nothing shows a new engine (no gap, counters never begin again): once the restart grace
    is over, the frozen engine is stalled again."""
    e, obs = stalled_engine(12)
    obs += [RestartObs(T0 + 12)]
    obs += [scrape(t, e) for t in range(13, 60)]
    seen = feed(obs, restart_grace_seconds=20)
    assert next(s for s in seen if s[0] >= 12) == (12.0, "starting", "restarting")
    assert seen[-1][1] == "stalled" and seen[-1][0] >= 32
