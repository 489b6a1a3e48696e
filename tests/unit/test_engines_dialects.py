"""The simulator's metrics dialects, driven step by step with a fake clock.

What matters for detection is WHEN each engine moves each series; these tests pin that down,
and check that every dialect's text parses, auto-detects and fills its profile's EngineSample.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_watchdog.core.model import EngineSample
from engine_watchdog.engines import PROFILES
from engine_watchdog.engines.detect import detect_profile
from engine_watchdog.probes.scrape import RawScrape, parse_scrape
from engine_watchdog.sim.api_metrics import SimMetrics
from engine_watchdog.sim.dialect_base import Dialect
from engine_watchdog.sim.dialects import DIALECT_CLASSES
from engine_watchdog.sim.protocol import FinishedRequest, IterationStats, SchedulerStats
from engine_watchdog.sim.settings import SimSettings, SimSettingsError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(name: str, **settings: object) -> tuple[Dialect, Clock]:
    clock = Clock()
    sim = SimSettings(dialect=name, **settings)  # type: ignore[arg-type]
    return DIALECT_CLASSES[name](sim, clock), clock


def prefill(dialect: Dialect, clock: Clock, running: int, rank: int = 0) -> None:
    """One step in which a request's prefill completed (its first token came out)."""
    clock.now += 0.02
    it = IterationStats(
        num_prompt_tokens=8, num_generation_tokens=running, time_to_first_tokens=[0.05]
    )
    dialect.record(rank, SchedulerStats(num_running_reqs=running, kv_cache_usage=0.1), it)


def decode(dialect: Dialect, clock: Clock, running: int, steps: int = 1, waiting: int = 0) -> None:
    for _ in range(steps):
        clock.now += 0.02
        stats = SchedulerStats(
            num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=0.2
        )
        dialect.record(0, stats, IterationStats(num_generation_tokens=running))


def finish(dialect: Dialect, clock: Clock, running_after: int = 0) -> None:
    clock.now += 0.02
    done = FinishedRequest("length", 2.0, prompt_tokens=8, generation_tokens=50)
    it = IterationStats(num_generation_tokens=1, finished=[done])
    dialect.record(0, SchedulerStats(num_running_reqs=running_after), it)


def read(dialect: Dialect, engine: str) -> EngineSample:
    body = dialect.exposition().decode()
    list(text_string_to_metric_families(body))  # valid Prometheus text
    obs = parse_scrape(RawScrape(1.0, status=200, body=body), PROFILES[engine])
    assert obs.error is None, obs.detail
    return obs.engines[0]


@pytest.mark.parametrize("name", sorted(DIALECT_CLASSES))
def test_every_dialect_parses_detects_and_fills_its_profile(name: str) -> None:
    dialect, clock = make(name)
    prefill(dialect, clock, running=1)
    decode(dialect, clock, running=1, steps=40)
    finish(dialect, clock)
    body = dialect.exposition().decode()
    assert detect_profile(body).engine == name
    got = read(dialect, name)
    assert got.running is not None and got.waiting is not None
    assert got.progress, "no progress series at all"


def test_sglang_moves_token_counters_only_when_a_request_finishes() -> None:
    dialect, clock = make("sglang")
    prefill(dialect, clock, running=2)
    decode(dialect, clock, running=2, steps=10)
    before = read(dialect, "sglang").progress
    assert "generation_tokens" not in before  # no request finished: the series is not there yet
    decode(dialect, clock, running=2, steps=5)
    after = read(dialect, "sglang").progress
    assert after["decode_passes"] == before["decode_passes"] + 5
    assert after["streamed_tokens"] == before["streamed_tokens"] + 10
    finish(dialect, clock)
    assert read(dialect, "sglang").progress["generation_tokens"] == 50.0


def test_sglang_gauges_lag_the_scheduler() -> None:
    dialect, clock = make("sglang")
    prefill(dialect, clock, running=1)
    # log_prefill_stats counts the batch that was already decoding, not the newcomer: a lone
    # request shows running=0 until the 40th decode batch logs.
    assert read(dialect, "sglang").running == 0.0
    decode(dialect, clock, running=1, steps=39)
    assert read(dialect, "sglang").running == 0.0
    decode(dialect, clock, running=1, steps=1)  # decode batch 40: log_decode_stats
    assert read(dialect, "sglang").running == 1.0


def test_sglang_refreshes_idle_gauges_after_30_s_but_never_while_work_is_left() -> None:
    dialect, clock = make("sglang")
    prefill(dialect, clock, running=1)
    decode(dialect, clock, running=1, steps=40)
    finish(dialect, clock)  # the last request is gone, the gauge still says 1
    assert read(dialect, "sglang").running == 1.0
    clock.now += 29.0
    assert read(dialect, "sglang").running == 1.0
    clock.now += 2.0
    assert read(dialect, "sglang").running == 0.0
    hung, hung_clock = make("sglang")
    prefill(hung, hung_clock, running=1)
    decode(hung, hung_clock, running=1, steps=40)  # then the scheduler stops stepping
    hung_clock.now += 600.0
    assert read(hung, "sglang").running == 1.0


def test_sglang_labels_ranks_only_with_data_parallelism() -> None:
    single, clock = make("sglang")
    prefill(single, clock, running=1)
    assert 'dp_rank="' not in single.exposition().decode()
    multi, clock = make("sglang", data_parallel_size=2)
    prefill(multi, clock, running=1, rank=1)
    body = multi.exposition().decode()
    assert 'dp_rank="1"' in body
    assert [
        e.engine for e in parse_scrape(RawScrape(1.0, 200, body), PROFILES["sglang"]).engines
    ] == [
        "0",
        "1",
    ]


def test_tgi_has_no_series_before_its_first_batch_and_zeroes_the_batch_after() -> None:
    dialect, clock = make("tgi")
    assert dialect.exposition() == b""
    prefill(dialect, clock, running=1)
    decode(dialect, clock, running=1, steps=3)
    body = dialect.exposition().decode()
    assert "tgi_batch_current_size 1.0" in body and "tgi_request_success" not in body
    assert 'tgi_batch_inference_count{method="prefill"} 1.0' in body
    assert 'tgi_batch_inference_count{method="decode"} 3.0' in body
    finish(dialect, clock)
    got = read(dialect, "tgi")
    assert (got.running, got.progress["finished_requests"]) == (0.0, 1.0)


def test_llamacpp_renders_every_series_from_the_start() -> None:
    dialect, clock = make("llamacpp")
    got = read(dialect, "llamacpp")
    assert (got.running, got.waiting) == (0.0, 0.0)
    assert got.progress == {"decode_calls": 0.0, "prompt_tokens": 0.0, "generation_tokens": 0.0}
    prefill(dialect, clock, running=1)
    decode(dialect, clock, running=1, steps=4, waiting=2)
    got = read(dialect, "llamacpp")
    assert (got.running, got.waiting, got.progress["decode_calls"]) == (1.0, 2.0, 5.0)
    assert got.progress["generation_tokens"] == 0.0  # on_prediction: only at slot release


def test_trtllm_moves_everything_only_when_a_request_completes() -> None:
    dialect, clock = make("trtllm")

    def error() -> str | None:
        body = dialect.exposition().decode()
        return parse_scrape(RawScrape(1.0, status=200, body=body), PROFILES["trtllm"]).error

    assert "trtllm_prompt_cached_tokens_total" in dialect.exposition().decode()  # from the start
    assert error() == "no-engine-series"
    prefill(dialect, clock, running=2)
    decode(dialect, clock, running=2, steps=100)
    assert error() == "no-engine-series"  # a long healthy generation shows nothing at all
    finish(dialect, clock, running_after=1)
    got = read(dialect, "trtllm")
    assert got.running == 1.0
    assert got.progress["finished_requests"] == 1.0 and got.progress["completed_requests"] == 1.0
    latency = got.progress["~iteration_latency"]
    decode(dialect, clock, running=1, steps=20)
    assert read(dialect, "trtllm").progress["~iteration_latency"] == latency  # no drain yet


def test_disabled_metrics_render_nothing() -> None:
    dialect, clock = make("sglang", disable_log_stats=True)
    prefill(dialect, clock, running=1)
    assert dialect.exposition() == b""


def test_sim_metrics_delegates_to_the_dialect_and_keeps_vllm_by_default() -> None:
    sim = SimMetrics(SimSettings(dialect="llamacpp"))
    sim.record(0, SchedulerStats(num_running_reqs=1), None)
    sim.set_sleep_level(0, 1)  # no sleep gauge in this dialect: nothing to do
    body = sim.exposition().decode()
    assert "llamacpp:n_decode_total 1.0" in body and "vllm:" not in body
    assert "process_cpu_seconds_total" not in body
    assert "vllm:num_requests_running" in SimMetrics(SimSettings()).exposition().decode()


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(SimSettingsError, match="dialect must be one of vllm, sglang"):
        SimSettings(dialect="ollama")


def test_the_real_clock_is_the_default() -> None:
    dialect = DIALECT_CLASSES["tgi"](SimSettings(dialect="tgi"))
    assert dialect.clock is time.monotonic
