"""SGLang (sglang.launch_server, ``--enable-metrics``) profile.

Sources (sgl-project/sglang):
- M: python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector, TokenizerMetricsCollector)
- S: python/sglang/srt/managers/scheduler_metrics_mixin.py (labels; when the gauges are written)
- O: python/sglang/srt/managers/scheduler_output_processor_mixin.py (per-decode-batch counter)
- R: python/sglang/srt/managers/scheduler_runtime_checker_mixin.py (idle refresh every 30 s)
- H: python/sglang/srt/entrypoints/http_server.py (/health, /health_generate, /abort_request)
- P: python/sglang/srt/managers/scheduler.py, detokenizer_manager.py,
  data_parallel_controller.py (setproctitle)

The scheduler process writes the gauges into prometheus_client's multiprocess files and the HTTP
process serves them, so a hung scheduler leaves /metrics answering with frozen values.
"""

from engine_watchdog.engines.profile import EngineProfile

SGLANG = EngineProfile(
    name="sglang",
    series_prefix="sglang:",
    # S: scheduler labels are model_name, engine_type, tp_rank, pp_rank, (current) moe_ep_rank
    # and, with DP, dp_rank.
    # Tokenizer-side series carry no rank label and land in rank "0".
    engine_label="dp_rank",
    # M/S: gauges written by log_prefill_stats (each prefill batch) and log_decode_stats (every
    # --decode-log-interval decode batches, default 40), so they lag; only attn_tp_rank 0
    # writes them unless --enable-metrics-for-all-schedulers.
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),  # M: "The token usage", 0..1 of the KV token pool
    progress={
        # O: +1 per processed decode batch (mode=decode_cuda_graph|decode_none): the step
        # heartbeat. Newer builds only; prefill batches do not count.
        "decode_passes": ("sglang:cuda_graph_passes_total",),
        # M: the tokenizer adds the number of new tokens of every streamed output to the
        # histogram's buckets, so _count rises per token while requests run (non-streaming
        # requests are flushed every 50 tokens, scheduler_output_processor_mixin.py).
        "streamed_tokens": ("sglang:inter_token_latency_seconds_count",),
        "first_tokens": ("sglang:time_to_first_token_seconds_count",),  # M: one per prefill done
        # M: "updated on each log interval" (mode=prefill_compute|prefill_cache|decode).
        "realtime_tokens": ("sglang:realtime_tokens_total",),
        # M: observe_one_finished_request: these three move only when a request FINISHES.
        "generation_tokens": ("sglang:generation_tokens_total",),
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "finished_requests": ("sglang:num_requests_total",),
    },
    health_path="/health",
    abort_paths=("/abort_request",),
    # H + io_struct.AbortReq(abort_all). Older builds pass only rid: there abort_all is a no-op
    # (answered 200), the stall persists and the ladder moves on to the restart.
    abort_all=("/abort_request", '{"abort_all": true}'),
    # P: sglang::scheduler plus a suffix that changed over releases (older _TP{n} and
    # _DP{d}_TP{n}; current _DP{d}_PP{p}_TP{t}_EP{e}, parts only where > 1), so matched as a
    # prefix; sglang::detokenizer, sglang::data_parallel_controller. The HTTP server keeps its
    # command line.
    process_titles=("sglang::scheduler", "sglang::data_parallel_controller", "sglang::detokenizer"),
    process_cmdline_markers=("sglang.launch_server",),
    title_roles=(
        ("scheduler", "engine-core"),
        ("data_parallel_controller", "dp-coordinator"),
        ("detokenizer", "other"),
    ),
    work_gauge_lag_s=30.0,  # R: "During idle time, also collect metrics every 30 seconds."
    health_waits_on_engine=True,  # H: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, 20 s timeout
    enable_hint="start SGLang with --enable-metrics",
    blind_spots=(
        "generation_tokens_total, prompt_tokens_total and num_requests_total move only when a "
        "request finishes: progress is read from cuda_graph_passes_total (per decode batch) and "
        "inter_token_latency_seconds_count (per streamed token) instead.",
        "older builds lack cuda_graph_passes_total: streamed tokens carry progress, and a "
        "non-streaming request shows it only every 50 tokens.",
        "running/queue gauges are refreshed every 40 decode batches and, when idle, every 30 s: "
        "they can say running>0 for up to 30 s after the last request ended. Keep "
        "--stall-seconds above 30 or keep the canary on (a canary's prefill rewrites them).",
        "/health runs a generation by default: it answers 503 after 20 s when the scheduler is "
        "hung, which is a stall, not proof of death.",
        "after a prefill the gauges count only the batch that was already decoding: a lone "
        "request that hangs within its first 40 decode batches shows running=0 and looks idle. "
        "The idle canary (--idle-canary-interval) is what catches it.",
        "a long chunked prefill moves no counter; token_usage (KV) still grows per chunk.",
    ),
)
