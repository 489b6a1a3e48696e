"""The pure detector over synthetic observation streams (one scrape per second)."""

from __future__ import annotations

import pytest

from engine_watchdog.core.detector import Detector
from engine_watchdog.core.model import Cause, EngineSample, HealthObs, Observation, ScrapeObs, State
from tests.tools.detector_feed import T0, Eng, decoding, first_stall, run, scrape, timeline


def test_seed_freeze_is_stalled_after_stall_seconds() -> None:
    e = Eng()
    obs = []
    for t in range(60):
        if t < 10:
            decoding(e)
        elif t == 10:
            e.running = 1  # the last request: running stays 1, counters freeze
        obs.append(scrape(t, e))
    _, seen = run(obs, stall_seconds=30)
    assert first_stall(seen) == (39.0, "no-progress")  # last progress seen at t=9
    assert ("suspect" in [s for _, s, _ in seen]) and seen[0][1] == "progressing"


def test_idle_server_is_never_stalled() -> None:
    _, seen = run(list(timeline(120, Eng())))
    assert seen == [(0.0, "idle", None)]


def test_slow_but_moving_decode_is_never_stalled() -> None:
    e = Eng(running=1)
    obs = []
    for t in range(200):
        if t % 25 == 0:  # one token every 25 s, with a 30 s window
            e.tokens += 1
        obs.append(scrape(t, e))
    _, seen = run(obs, stall_seconds=30)
    assert first_stall(seen) is None


def test_long_prefill_with_growing_kv_is_never_stalled() -> None:
    e = Eng(running=1)
    obs = []
    for t in range(300):
        e.kv = min(1.0, t / 400)  # chunked prefill: KV grows, no token, no prompt counter
        obs.append(scrape(t, e))
    _, seen = run(obs)
    assert first_stall(seen) is None


def test_sleeping_engine_with_queued_requests_is_not_stalled() -> None:
    e = Eng(waiting=3, asleep=True)
    _, seen = run(list(timeline(100, e)))
    assert seen == [(0.0, "sleeping", None)]


def test_counter_reset_is_a_restart_not_a_stall() -> None:
    e = Eng(running=1, tokens=5000)
    obs = list(timeline(20, e))
    e.tokens = 0  # engine restarted: counters from zero, a request already running
    obs += [scrape(20 + t, e) for t in range(25)]
    d, seen = run(obs, stall_seconds=30)
    assert first_stall(seen) is None
    assert d.verdicts["0"].last_progress_t == T0 + 20


def test_scrape_failures_are_unreachable_never_stalled() -> None:
    e = Eng(running=2)
    obs: list[Observation] = [scrape(0, e)]
    obs += [ScrapeObs(T0 + t, error=Cause.REFUSED) for t in range(1, 100)]
    _, seen = run(obs)
    assert first_stall(seen) is None
    assert seen[-1] == (1.0, "unreachable", "connection-refused")


def test_gap_in_scrapes_restarts_the_clock() -> None:
    e = Eng(running=1)
    obs: list[Observation] = [scrape(t, e) for t in range(20)]
    obs += [ScrapeObs(T0 + t, error=Cause.TIMEOUT) for t in range(20, 25)]
    obs += [scrape(t, e) for t in range(25, 50)]
    _, seen = run(obs, stall_seconds=30)
    assert first_stall(seen) is None  # 20 s before the gap + 24 s after: never 30 s seen whole


def test_admission_stall_cause() -> None:
    e = Eng(running=0, waiting=4, kv=0.1)
    _, seen = run(list(timeline(40, e)), stall_seconds=30)
    assert first_stall(seen) == (30.0, "admission-stall")


def test_each_data_parallel_rank_is_judged_on_its_own() -> None:
    busy, stuck = Eng("0", running=1), Eng("1", running=1)
    obs = []
    for t in range(40):
        busy.tokens += 3
        obs.append(scrape(t, busy, stuck))
    d, _ = run(obs, stall_seconds=30)
    assert d.verdicts["0"].state is State.PROGRESSING
    assert d.verdicts["1"].state is State.STALLED


def test_health_503_is_engine_dead_and_frozen_metrics_do_not_undo_it() -> None:
    e = Eng(running=2)
    obs: list[Observation] = [scrape(0, e), HealthObs(T0 + 0.5, 503), scrape(1, e)]
    d, seen = run(obs)
    assert seen[-1] == (0.5, "stalled", "engine-dead")
    assert d.verdicts["0"].cause == "engine-dead"


def test_metrics_and_health_timing_out_is_api_unresponsive() -> None:
    e = Eng(running=2)
    obs: list[Observation] = [scrape(0, e)]
    for t in range(1, 40):
        obs += [
            ScrapeObs(T0 + t, error=Cause.TIMEOUT),
            HealthObs(T0 + t + 0.1, None, Cause.TIMEOUT),
        ]
    _, seen = run(obs, stall_seconds=30)
    assert first_stall(seen) == (32.0, "api-unresponsive")


def test_startup_grace_delays_the_first_verdict() -> None:
    e = Eng(running=1)
    _, seen = run(list(timeline(40, e)), stall_seconds=5, startup_grace_seconds=20)
    assert first_stall(seen) == (20.0, "no-progress")


def test_out_of_order_observations_are_ignored() -> None:
    e = Eng(running=1)
    d = Detector()
    d.feed(scrape(10, e))
    assert d.feed(scrape(5, Eng(running=0))) == []
    assert d.verdicts["0"].state is State.PROGRESSING


@pytest.mark.parametrize("stall", [10.0, 30.0, 60.0])
def test_stall_latency_follows_the_setting(stall: float) -> None:
    e = Eng(running=1)
    _, seen = run(list(timeline(100, e)), stall_seconds=stall, startup_grace_seconds=0)
    assert first_stall(seen) == (stall, "no-progress")


def test_a_gauge_carried_progress_signal_dropping_is_progress_not_a_restart() -> None:
    def s(t: float, latency: float) -> ScrapeObs:
        sample = EngineSample("0", 1, 0, None, False, {"~iteration_latency": latency, "tokens": 5})
        return ScrapeObs(T0 + t, (sample,), status=200)

    d = Detector()
    d.feed(s(0, 0.5))
    d.feed(s(1, 0.2))
    v = d.verdicts["0"]
    assert v.last_progress_t == T0 + 1 and "restarted" not in " ".join(v.evidence)


def test_metrics_from_the_engine_loop_timing_out_is_a_stall() -> None:
    """llama.cpp answers /metrics from its engine loop: /metrics timing out while /health says
    200 means the loop hangs. Other engines: unreachable, never stalled."""
    obs: list[Observation] = [scrape(0, Eng(running=1))]
    for t in range(1, 40):
        obs += [ScrapeObs(T0 + t, error=Cause.TIMEOUT), HealthObs(T0 + t + 0.1, 200)]
    _, seen = run(obs, stall_seconds=30, metrics_from_engine_loop=True)
    assert first_stall(seen) == (30.0, "no-progress")  # the loop last answered at t=0
    _, seen = run(obs, stall_seconds=30)
    assert first_stall(seen) is None


def test_an_engine_loop_scrape_timeout_counts_the_time_it_waited() -> None:
    """A scrape that waited 10 s for the engine loop proves the loop silent for those 10 s: the
    verdict need not wait for the next scrape to begin after the window."""
    obs: list[Observation] = [ScrapeObs(T0, (Eng(running=1).sample(),), status=200, elapsed_s=0.5)]
    for t in (1, 11, 21, 31):
        obs += [ScrapeObs(T0 + t, error=Cause.TIMEOUT, elapsed_s=10.0), HealthObs(T0 + t + 10, 200)]
    _, seen = run(obs, stall_seconds=25, metrics_from_engine_loop=True)
    assert first_stall(seen) == (21.0, "no-progress")  # silent from 0.5 until 31 >= 25
