"""vLLM (V1 engine, 0.1x-0.33) profile.

Names from vllm/v1/metrics/loggers.py (PrometheusStatLogger) and vllm/v1/metrics/prometheus.py, the
MFU counter from
vllm/v1/metrics/perf.py (PerfMetricsProm); process titles from vllm's use of setproctitle
(``VLLM::EngineCore``, ``VLLM::Worker``...).
"""

from engine_watchdog.engines.profile import EngineProfile

VLLM = EngineProfile(
    name="vllm",
    series_prefix="vllm:",
    engine_label="engine",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    # kv_cache_usage_perc replaced gpu_cache_usage_perc; older servers still export the latter.
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    progress={
        "generation_tokens": ("vllm:generation_tokens_total",),
        # One count per engine step that produced output: the best step heartbeat.
        "iterations": ("vllm:iteration_tokens_total_count",),
        # Rises only when a prefill completes, so a long chunked prefill freezes it.
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "finished_requests": ("vllm:request_success_total",),
        "preemptions": ("vllm:num_preemptions_total",),
        "spec_decode_accepted": ("vllm:spec_decode_num_accepted_tokens_total",),
        "spec_decode_drafted": ("vllm:spec_decode_num_draft_tokens_total",),
        # perf.py PerfMetricsProm: moves on every executed step, prefill chunks included
        # (only when MFU metrics are on: --enable-mfu-metrics).
        "estimated_flops": ("vllm:estimated_flops_per_gpu_total",),
    },
    sleep_gauge="vllm:engine_sleep_state",
    sleep_awake_label=("sleep_state", "awake"),
    abort_paths=("/inference/v1/abort_requests", "/abort_requests"),
    process_titles=("VLLM::EngineCore", "VLLM::Worker", "VLLM::DPCoordinator", "VLLM::APIServer"),
    process_cmdline_markers=("vllm.entrypoints.openai.api_server", "vllm serve", "vllm/bin/vllm"),
    canary_id_format="cmpl-{}-0",  # vllm/entrypoints/openai/completion/serving.py
    enable_hint="do not start vLLM with --disable-log-stats (it removes every vllm: series)",
    blind_spots=(
        "prompt_tokens_total moves only when a prefill completes: a long chunked prefill is "
        "carried by kv_cache_usage_perc and, with --enable-mfu-metrics, estimated_flops.",
    ),
)
