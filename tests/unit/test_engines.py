"""Engine profiles and auto-detection: each engine's own /metrics text -> EngineSample.

The expositions below are written in each engine's format as its source produces it (names,
labels, counter suffixes, types); engine_watchdog/engines/<engine>.py cites the files.
"""

from __future__ import annotations

import json

import pytest

from engine_watchdog.core.model import EngineSample
from engine_watchdog.engines import LLAMACPP, PROFILES, SGLANG, TGI, TRTLLM, VLLM, EngineProfile
from engine_watchdog.engines.detect import detect_profile
from engine_watchdog.probes.scrape import RawScrape, parse_scrape
from engine_watchdog.sim.settings import DIALECTS

SG = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"'
SGLANG_BODY = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{SG},dp_rank="0"}} 3.0
sglang:num_running_reqs{{{SG},dp_rank="1"}} 1.0
sglang:num_queue_reqs{{{SG},dp_rank="0"}} 2.0
sglang:num_queue_reqs{{{SG},dp_rank="1"}} 0.0
sglang:token_usage{{{SG},dp_rank="0"}} 0.25
sglang:token_usage{{{SG},dp_rank="1"}} 0.5
sglang:gen_throughput{{{SG},dp_rank="0"}} 812.5
sglang:cuda_graph_passes_total{{{SG},dp_rank="0",mode="decode_cuda_graph"}} 400.0
sglang:cuda_graph_passes_total{{{SG},dp_rank="0",mode="decode_none"}} 7.0
sglang:cuda_graph_passes_total{{{SG},dp_rank="1",mode="decode_cuda_graph"}} 90.0
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{{model_name="m"}} 1234.0
sglang:num_requests_total{{model_name="m"}} 17.0
sglang:inter_token_latency_seconds_bucket{{model_name="m",le="+Inf"}} 5000.0
sglang:inter_token_latency_seconds_count{{model_name="m"}} 5000.0
sglang:inter_token_latency_seconds_sum{{model_name="m"}} 61.5
"""

TGI_BODY = """\
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 4
# TYPE tgi_queue_size gauge
tgi_queue_size 9
# TYPE tgi_batch_inference_count counter
tgi_batch_inference_count{method="prefill"} 12
tgi_batch_inference_count{method="decode"} 300
tgi_batch_inference_success{method="prefill"} 12
tgi_batch_inference_success{method="decode"} 299
# TYPE tgi_batch_forward_duration summary
tgi_batch_forward_duration{method="decode",quantile="0.5"} 0.021
tgi_batch_forward_duration_sum{method="decode"} 6.3
tgi_batch_forward_duration_count{method="decode"} 299
tgi_request_success 8
tgi_request_generated_tokens_sum 960
tgi_request_generated_tokens_count 8
"""

LLAMACPP_BODY = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 512
llamacpp:tokens_predicted_total 2048
llamacpp:n_decode_total 2100
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
llamacpp:requests_deferred 1
llamacpp:kv_cache_usage_ratio 0.125
"""

TL = 'model_name="undefined",engine_type="undefined"'
TRTLLM_BODY = f"""\
# TYPE trtllm_request_success counter
trtllm_request_success_total{{{TL},finished_reason="stop"}} 5.0
trtllm_request_success_total{{{TL},finished_reason="length"}} 2.0
trtllm_generation_tokens_total{{{TL}}} 700.0
trtllm_num_requests_completed_total{{{TL}}} 7.0
trtllm_num_requests_running{{{TL}}} 6.0
trtllm_num_requests_waiting{{{TL}}} 0.0
trtllm_kv_cache_utilization{{{TL}}} 0.4
trtllm_iteration_latency_seconds{{{TL}}} 0.0213
http_requests_total{{handler="/v1/completions",method="POST",status="200"}} 7.0
"""


def sample(body: str, profile: EngineProfile) -> tuple[EngineSample, ...]:
    obs = parse_scrape(RawScrape(100.0, status=200, body=body), profile)
    assert obs.error is None, obs.detail
    return obs.engines


def test_sglang_ranks_are_split_by_dp_rank_and_progress_reads_the_step_counters() -> None:
    rank0, rank1 = sample(SGLANG_BODY, SGLANG)
    assert (rank0.engine, rank0.running, rank0.waiting, rank0.kv_usage) == ("0", 3.0, 2.0, 0.25)
    assert (rank1.engine, rank1.running, rank1.waiting, rank1.kv_usage) == ("1", 1.0, 0.0, 0.5)
    # Both CUDA-graph modes count: any decode batch is a step.
    assert rank0.progress["decode_passes"] == 407.0
    assert rank1.progress == {"decode_passes": 90.0}
    # Tokenizer-side series have no dp_rank: they land in rank "0".
    assert rank0.progress["streamed_tokens"] == 5000.0
    assert rank0.progress["generation_tokens"] == 1234.0


def test_tgi_reads_unsuffixed_counters_and_summary_counts() -> None:
    (engine,) = sample(TGI_BODY, TGI)
    assert (engine.engine, engine.running, engine.waiting, engine.kv_usage) == ("0", 4.0, 9.0, None)
    assert engine.progress == {
        "inference_calls": 312.0,
        "inference_success": 311.0,
        "forward_steps": 299.0,
        "finished_requests": 8.0,
        "generated_tokens": 960.0,
    }


def test_llamacpp_reads_slots_and_the_decode_call_counter() -> None:
    (engine,) = sample(LLAMACPP_BODY, LLAMACPP)
    assert (engine.running, engine.waiting, engine.kv_usage) == (2.0, 1.0, 0.125)
    assert engine.progress == {
        "decode_calls": 2100.0,
        "prompt_tokens": 512.0,
        "generation_tokens": 2048.0,
    }


def test_trtllm_sums_finish_reasons_and_keeps_the_latency_gauge() -> None:
    (engine,) = sample(TRTLLM_BODY, TRTLLM)
    assert (engine.running, engine.waiting, engine.kv_usage) == (6.0, 0.0, 0.4)
    assert engine.progress["finished_requests"] == 7.0
    assert engine.progress["~iteration_latency"] == 0.0213


def test_a_body_of_another_engine_is_no_engine_series() -> None:
    obs = parse_scrape(RawScrape(1.0, status=200, body=TGI_BODY), SGLANG)
    assert obs.error == "no-engine-series"
    assert "tgi_batch_current_size" in (obs.detail or "")


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_every_profile_is_consistent(profile: EngineProfile) -> None:
    assert PROFILES[profile.name] is profile
    names = [*profile.running, *profile.waiting, *profile.kv_usage]
    names += [n for series in profile.progress.values() for n in series]
    assert names and all(n.startswith(profile.series_prefix) for n in names)
    assert profile.wanted_series() == frozenset(names) | (
        {profile.sleep_gauge} if profile.sleep_gauge else set()
    )
    assert profile.gauge_progress <= profile.progress.keys()
    assert profile.metrics_path.startswith("/") and profile.health_path.startswith("/")
    assert profile is VLLM or profile.blind_spots, "write the blind spots down"
    roles = {role for _, role in (*profile.title_roles, *profile.cmdline_roles)}
    assert roles <= {"api-server", "engine-core", "worker", "dp-coordinator", "other"}


def test_profiles_and_simulator_dialects_name_the_same_engines() -> None:
    assert set(DIALECTS) == set(PROFILES)


def test_vllm_keeps_its_defaults() -> None:
    assert VLLM.title_roles[0] == ("EngineCore", "engine-core")
    assert not (VLLM.cmdline_roles or VLLM.gauge_progress or VLLM.abort_all)
    assert (VLLM.work_gauge_lag_s, VLLM.metrics_in_engine_loop) == (0.0, False)


@pytest.mark.parametrize(
    ("body", "engine"),
    [
        (SGLANG_BODY, "sglang"),
        (TGI_BODY, "tgi"),
        (LLAMACPP_BODY, "llamacpp"),
        (TRTLLM_BODY, "trtllm"),
    ],
    ids=["sglang", "tgi", "llamacpp", "trtllm"],
)
def test_detection_names_the_engine_by_its_series_prefix(body: str, engine: str) -> None:
    found = detect_profile(body)
    assert found.engine == engine and found.profile is PROFILES[engine]
    assert found.message().startswith(f"detected engine {engine} from ")


def test_detection_of_vllm_with_process_series_around() -> None:
    body = 'process_cpu_seconds_total 3.0\nvllm:num_requests_running{engine="0"} 1.0\n'
    assert detect_profile(body).engine == "vllm"


def test_detection_prefers_the_prefix_with_most_series() -> None:
    # A vLLM server whose model name happens to start like another engine's prefix.
    body = LLAMACPP_BODY + 'vllm:num_requests_running{model_name="tgi_x"} 1\n'
    assert detect_profile(body).engine == "llamacpp"


def test_unknown_engine_says_what_it_found_and_how_to_choose() -> None:
    body = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
    body += 'python_gc_objects_collected_total{generation="0"} 12\nup 1\n'
    found = detect_profile(body)
    assert found.engine is None and found.profile is None
    message = found.message()
    assert message.startswith("unknown engine: found 3 series of no known engine (")
    assert "process_cpu_seconds_total" in message
    assert "pass --engine (llamacpp, sglang, tgi, trtllm, vllm)" in message
    assert "--enable-metrics" in message and "--metrics" in message  # metrics may be off


def test_unknown_engine_on_an_empty_body() -> None:
    found = detect_profile("")
    assert found.engine is None
    assert found.message() == (
        "unknown engine: found no series at all; "
        "pass --engine (llamacpp, sglang, tgi, trtllm, vllm)"
    )


def test_a_tie_is_not_a_guess() -> None:
    body = "sglang:num_running_reqs 1\ntgi_queue_size 2\n"
    found = detect_profile(body)
    assert found.engine is None
    assert "sglang: (1) and tgi_ (1)" in found.message()


def test_trtllm_json_iteration_stats_point_at_the_prometheus_path() -> None:
    stats = [{"iter": 41, "iterLatencyMS": 16.5, "numActiveRequests": 2, "kvCacheStats": {}}]
    found = detect_profile(json.dumps(stats))
    assert found.engine == "trtllm"
    assert "/prometheus/metrics" in found.message() and "return_perf_metrics" in found.message()
    assert detect_profile("[]").engine == "trtllm"  # an idle server's drained queue


def test_llamacpp_without_metrics_flag_is_named_with_the_fix() -> None:
    body = json.dumps(
        {
            "error": {
                "code": 501,
                "message": "This server does not support metrics endpoint. "
                "Start it with `--metrics`",
                "type": "not_supported_error",
            }
        }
    )
    found = detect_profile(body, status=501)
    assert found.engine == "llamacpp"
    assert "--metrics" in found.message()


def test_detection_can_be_limited_to_some_profiles() -> None:
    assert detect_profile(TGI_BODY, profiles=[VLLM, SGLANG]).engine is None
    assert detect_profile("[]", profiles=[VLLM]).engine is None
