"""TensorRT-LLM's trtllm-serve profile (Prometheus at /prometheus/metrics).

Sources (NVIDIA/TensorRT-LLM):
- S: tensorrt_llm/serve/openai_server.py (routes: /metrics answers JSON iteration stats,
  /prometheus/metrics is mounted only with ``return_perf_metrics``; /health, /health_generate;
  the iteration-stats collector loop, woken when a request completes)
- M: tensorrt_llm/metrics/collector.py (MetricsCollector: names, labels, when each is written)
- D: docs/source/commands/trtllm-serve.rst (/metrics JSON example with "iter", "iterLatencyMS")
- W: tensorrt_llm/llmapi/mpi_session.py (MpiPoolSession: mpi4py's MPIPoolExecutor starts the
  workers, ``python -m mpi4py.futures.server``, even for one GPU) and executor.py; no
  setproctitle anywhere, so workers are known by that command line

Labels are model_name and engine_type (openai_server passes "undefined" for both); no rank.
The iteration-level gauges exist in recent builds only; older ones export per-request series.
"""

from engine_watchdog.engines.profile import EngineProfile

TRTLLM = EngineProfile(
    name="trtllm",
    series_prefix="trtllm_",
    engine_label="",
    metrics_path="/prometheus/metrics",  # S: /metrics is JSON, not Prometheus text
    # M: log_iteration_stats (numActiveRequests, numQueuedRequests, usedNumBlocks/maxNumBlocks);
    # S: drained only when a request completes, so they lag.
    running=("trtllm_num_requests_running",),
    waiting=("trtllm_num_requests_waiting",),
    kv_usage=("trtllm_kv_cache_utilization",),
    progress={
        # M: log_request_metrics_dict: written when a request finishes.
        "finished_requests": ("trtllm_request_success_total",),
        "generation_tokens": ("trtllm_generation_tokens_total",),
        # M: log_iteration_stats, drained on completion (S).
        "completed_requests": ("trtllm_num_requests_completed_total",),
        # M: a gauge set from every drained iteration's iterLatencyMS: changes at each drain.
        "iteration_latency": ("trtllm_iteration_latency_seconds",),
    },
    gauge_progress=frozenset({"iteration_latency"}),
    health_path="/health",  # S: the executor's health flag; /health_generate runs a generation
    abort_paths=(),  # S: a disconnected client aborts its request (await_disconnected)
    process_cmdline_markers=("trtllm-serve",),
    # W: the model runs in the MPI workers; trtllm-serve is the HTTP proxy in front of them.
    cmdline_roles=(("mpi4py.futures.server", "engine-core"), ("trtllm-serve", "api-server")),
    progress_needs_canary=True,
    enable_hint=(
        "set return_perf_metrics: true (and enable_iter_perf_stats: true for the PyTorch "
        "backend) in --extra_llm_api_options; the Prometheus series are at /prometheus/metrics"
    ),
    blind_spots=(
        "every Prometheus series moves only when a request completes (per-request metrics, and "
        "iteration stats drained on completion): a long healthy generation looks like a hang. "
        "The canary carries progress (its completion moves the counters); keep it on, or set "
        "--stall-seconds above the longest expected request.",
        "the work gauges keep their last value after the engine went idle: nothing resets "
        "them and no drain happens without a completion (M, S). The canary's completion is "
        "what tells an idle engine from a hung one.",
        "the per-iteration counter 'iter' is only in the JSON /metrics. Older builds drain the "
        "stats queue there (shared with the Prometheus collector); current ones serve a buffer "
        "the collector fills on completions, so 'iter' is no live heartbeat either. Not read.",
        "MPI workers (python -m mpi4py.futures.server) set no process title; they are the "
        "engine-core role. Their parent (trtllm-serve or an MPI daemon) was not checked.",
    ),
)
