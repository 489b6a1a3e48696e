"""Hugging Face Text Generation Inference (text-generation-launcher, v3 backend) profile.

Sources (huggingface/text-generation-inference):
- B: backends/v3/src/backend.rs (batching task: batch gauges, per-call inference counters)
- Q: backends/v3/src/queue.rs (tgi_queue_size)
- D: docs/source/reference/metrics.md (names, types)
- R: router/src/server.rs (tgi_request_success, tgi_request_generated_tokens: per finished
  request; /health awaits infer.health() with no timeout)
- H: backends/v3/src/backend.rs health() and backends/v3/src/client/sharded_client.rs: /health
  asks every shard over gRPC (a liveness prefill until the first success, then Health), and the
  shard serves Health on the same event loop whose Decode runs generate_token synchronously
- L: launcher/src/main.rs (spawns ``text-generation-server serve <model> --uds-path ...``, one
  per rank, and text-generation-router, each in its own process group)

TGI exports with the Rust metrics-exporter-prometheus crate: counters keep their names (no
``_total``), and a series exists only once it was first touched.
"""

from engine_watchdog.engines.profile import EngineProfile

TGI = EngineProfile(
    name="tgi",
    series_prefix="tgi_",
    engine_label="",  # no rank label: one engine per router
    # B: set when each decode loop iteration starts, 0 once the batch is empty.
    running=("tgi_batch_current_size",),
    # Q: +1 on append (router side, so it keeps growing while the shards hang), set on next_batch.
    waiting=("tgi_queue_size",),
    kv_usage=(),  # TGI exports no KV-cache usage (D); tgi_batch_current_max_tokens is no ratio
    progress={
        # B: +1 at the START of every prefill/decode call (method=prefill|decode): it moves once
        # more when a call begins, then stays flat while that call hangs. The step heartbeat.
        "inference_calls": ("tgi_batch_inference_count",),
        "inference_success": ("tgi_batch_inference_success",),  # B: +1 when a call returns
        "forward_steps": ("tgi_batch_forward_duration_count",),  # B: histogram, one per call
        "finished_requests": ("tgi_request_success",),  # R: per finished request
        "generated_tokens": ("tgi_request_generated_tokens_sum",),  # R: histogram, at the end
    },
    health_path="/health",
    health_waits_on_engine=True,  # H: hangs while a shard hangs (no answer, neither 200 nor 503)
    abort_paths=(),  # no abort endpoint: a dropped client connection cancels its request
    process_cmdline_markers=("text-generation-router",),
    cmdline_roles=(
        ("text-generation-server", "engine-core"),  # L: one Python shard per TP rank
        ("text-generation-router", "api-server"),
        ("text-generation-launcher", "other"),
    ),
    launcher_cmdline_markers=("text-generation-launcher",),
    blind_spots=(
        "series appear only after first use: before the first request /metrics may hold no "
        "tgi_ series, so auto-detection and the work gauges wait for traffic.",
        "no KV-cache usage gauge.",
        "the shards are siblings of the router (children of text-generation-launcher): process "
        "discovery must start from the launcher to find them.",
        "/health asks every shard over gRPC with no timeout, and a shard answers it on the "
        "event loop its hung decode blocks: /health hangs (read from source, not run). The "
        "router serves /metrics itself, so the frozen counters are still seen. /health is not "
        "polled (each round would wait out its timeout); the canary covers it.",
    ),
)
