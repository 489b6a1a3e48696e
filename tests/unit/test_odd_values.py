"""Values no healthy exposition has, and what the watchdog makes of them
(docs/reliability.md, "Probes"). The expositions are tests/data/bad_input's; the detector is
fed what the metrics probe parses from them, so this is the code that runs live."""

from __future__ import annotations

from pathlib import Path

from engine_watchdog.core.detector import Detector
from engine_watchdog.core.model import Observation, Reason, ScrapeObs, State
from engine_watchdog.core.progress import FLAP_WINDOW_S
from engine_watchdog.core.settings import DetectorSettings
from engine_watchdog.engines import VLLM
from engine_watchdog.probes.scrape import RawScrape, parse_scrape
from tests.tools.detector_feed import T0, Eng, first_stall, run, scrape

BAD = Path(__file__).resolve().parents[1] / "data" / "bad_input"
SETTINGS = DetectorSettings(stall_seconds=20.0, startup_grace_seconds=0.0)


def parsed(t: float, name: str) -> ScrapeObs:
    body = (BAD / name).read_text()
    return parse_scrape(RawScrape(T0 + t, status=200, body=body, elapsed_s=0.003), VLLM)


def feed(obs: list[Observation]) -> tuple[Detector, list[tuple[float, str, Reason | None]]]:
    detector = Detector(SETTINGS)
    seen = []
    for o in obs:
        for change in detector.feed(o):
            seen.append((round(change.new.t - T0, 1), change.new.state.value, change.new.cause))
    return detector, seen


def test_two_frozen_replicas_behind_one_url_are_stalled_and_said_once() -> None:
    """Counters flap between two sources every scrape: one restart at most, then no progress."""
    replicas = ["metrics_flapping_replica_a.txt", "metrics_flapping_replica_b.txt"]
    detector, seen = feed([parsed(t, replicas[t % 2]) for t in range(40)])
    # Quiet since t=1: the first drop is taken for a restart (it looks like one), no more.
    assert first_stall(seen) == (21.0, "no-progress"), seen
    assert [n.kind for n in detector.notes] == ["flapping-counters"]


def test_a_real_restart_is_still_a_restart() -> None:
    e = Eng(running=1, tokens=5000)
    obs = [scrape(t, e) for t in range(5)]
    e.tokens = 0
    for t in range(5, 40):
        e.tokens += 3  # the new engine serves
        obs.append(scrape(t, e))
    detector, seen = run(obs, stall_seconds=20)
    assert first_stall(seen) is None
    assert not detector.notes


def test_an_engine_that_restarts_again_later_is_not_flapping() -> None:
    e = Eng(running=1, tokens=100)
    obs = []
    for t in range(200):
        e.tokens = 0 if t in (10, 10 + int(FLAP_WINDOW_S) + 5) else e.tokens + 2
        obs.append(scrape(t, e))
    detector, seen = run(obs, stall_seconds=20)
    assert first_stall(seen) is None
    assert not detector.notes


def test_a_counter_reading_negative_every_other_scrape_masks_nothing() -> None:
    frozen = parsed(0, "metrics_duplicate_series.txt").engines[0]  # tokens frozen at 300+300
    negative = parsed(1, "metrics_negative_counter.txt")
    assert "generation_tokens" not in negative.engines[0].progress  # -1: left out
    assert [n.kind for n in negative.notes] == ["bad-counter"]
    obs: list[Observation] = []
    for t in range(40):
        good = ScrapeObs(T0 + t, (frozen,), status=200)
        obs.append(good if t % 2 == 0 else parsed(t, "metrics_negative_counter.txt"))
    _, seen = feed(obs)
    assert first_stall(seen) == (20.0, "no-progress"), seen


def test_nan_work_gauges_are_unknown_not_idle() -> None:
    nan = parsed(0, "metrics_nan_running.txt")
    (sample,) = nan.engines
    assert (sample.running, sample.waiting, sample.unknown) == (None, None, ("running", "waiting"))
    assert [n.kind for n in nan.notes] == ["unknown-work"]
    _, seen = feed([parsed(t, "metrics_nan_running.txt") for t in range(30)])
    assert seen[0][1] != "idle"  # was: idle (NaN read as zero), so a hang was never seen
    assert first_stall(seen) == (20.0, "no-progress"), seen


def test_nan_work_gauges_keep_the_last_number_read() -> None:
    """Busy (running 2), then the gauges turn NaN: still busy. Idle, then NaN: still idle."""
    busy = parsed(0, "metrics_duplicate_series.txt")
    _, seen = feed([busy, *(parsed(t, "metrics_nan_running.txt") for t in range(1, 30))])
    assert first_stall(seen) is not None
    idle = Eng(kv=0.5, tokens=1200)  # the NaN exposition's other values: no movement
    obs: list[Observation] = [scrape(0, idle)]
    obs += [parsed(t, "metrics_nan_running.txt") for t in range(1, 30)]
    _, seen = feed(obs)
    assert [s for _, s, _ in seen] == ["idle"]


def test_duplicate_series_are_summed_and_said() -> None:
    obs = parsed(0, "metrics_duplicate_series.txt")
    (sample,) = obs.engines
    assert sample.progress["generation_tokens"] == 600.0  # both copies counted
    assert sample.running == 4.0
    assert [n.kind for n in obs.notes] == ["duplicate-series"]
    assert 'vllm:generation_tokens_total{engine="0",model_name="stub-model"}' in obs.notes[0].text


def test_a_stale_duplicate_cannot_hide_a_live_copy() -> None:
    """One copy frozen (left by another process), the other moving: progress."""
    head = (BAD / "metrics_duplicate_series.txt").read_text()
    obs: list[Observation] = []
    for t in range(40):
        live = f'vllm:generation_tokens_total{{engine="0",model_name="stub-model"}} {300 + t}\n'
        raw = RawScrape(T0 + t, status=200, body=head + live, elapsed_s=0.003)
        obs.append(parse_scrape(raw, VLLM))
    _, seen = feed(obs)
    assert first_stall(seen) is None
    assert seen[-1][1] == State.PROGRESSING.value
