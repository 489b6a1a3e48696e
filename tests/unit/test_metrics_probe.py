"""The filtered exposition parse and per-rank grouping of the metrics probe."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from engine_watchdog.core.exposition import filter_body, parse_samples
from engine_watchdog.engines import VLLM
from engine_watchdog.probes.scrape import RawScrape, parse_scrape

DATA = Path(__file__).parent.parent / "data"

TWO_RANKS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 0.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} NaN
vllm:generation_tokens_total{engine="0",model_name="m"} 120.0
vllm:generation_tokens_total{engine="1",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 42.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 40.0
vllm:engine_sleep_state{engine="1",model_name="m",sleep_state="awake"} 0.0
vllm:engine_sleep_state{engine="1",model_name="m",sleep_state="weights_offloaded"} 1.0
"""


def test_groups_series_by_rank_and_sums_label_sets() -> None:
    obs = parse_scrape(RawScrape(1.0, status=200, body=TWO_RANKS), VLLM)
    assert obs.error is None
    e0, e1 = obs.engines
    assert (e0.engine, e0.running, e0.waiting, e0.kv_usage) == ("0", 3.0, 1.0, 0.25)
    assert e0.progress == {"generation_tokens": 120.0, "iterations": 42.0, "finished_requests": 5.0}
    assert not e0.asleep
    assert e1.asleep and e1.kv_usage is None  # NaN is no value, not a movement


def test_old_kv_name_is_understood() -> None:
    body = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:num_requests_running{model_name="m"} 1\n'
    )
    (e,) = parse_scrape(RawScrape(1.0, status=200, body=body), VLLM).engines
    assert e.engine == "0" and e.kv_usage == 0.5


def test_a_server_without_vllm_series_gets_one_clear_line() -> None:
    body = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.0\nup 1\n"
    obs = parse_scrape(RawScrape(1.0, status=200, body=body), VLLM)
    assert obs.error == "no-engine-series"
    assert obs.detail is not None
    assert "process_cpu_seconds_total" in obs.detail and "--disable-log-stats" in obs.detail


def test_http_errors_are_errors_not_empty_engines() -> None:
    obs = parse_scrape(RawScrape(1.0, status=500, body="oops"), VLLM)
    assert obs.error == "http-500" and obs.engines == ()


def test_label_values_with_escapes_and_braces() -> None:
    body = 'vllm:num_requests_running{model_name="a\\"b}{,c",engine="2"} 4\n'
    (s,) = parse_samples(body, VLLM.wanted_series())
    assert s.labels == {"model_name": 'a"b}{,c', "engine": "2"} and s.value == 4


def test_filtered_parse_agrees_with_prometheus_client_on_real_vllm_output() -> None:
    """Every kept sample equals what the reference parser reads from the same body."""
    bodies = sorted((DATA / "vllm").glob("metrics-*.txt")) if (DATA / "vllm").exists() else []
    texts = [p.read_text() for p in bodies] or [TWO_RANKS]
    wanted = VLLM.wanted_series()
    for text in texts:
        ours = {
            (s.name, tuple(sorted(s.labels.items()))): s.value for s in parse_samples(text, wanted)
        }
        ref = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name in wanted
        }
        assert ours.keys() == ref.keys()
        for key, value in ref.items():
            assert ours[key] == value or (math.isnan(value) and math.isnan(ours[key]))


def test_filter_body_keeps_only_wanted_samples_and_reparses_the_same() -> None:
    kept = filter_body(TWO_RANKS, VLLM.wanted_series())
    assert "# HELP" not in kept and "_bucket" not in kept
    a = parse_scrape(RawScrape(1.0, status=200, body=kept), VLLM)
    b = parse_scrape(RawScrape(1.0, status=200, body=TWO_RANKS), VLLM)
    assert [e.progress for e in a.engines] == [e.progress for e in b.engines]
