"""llama.cpp's llama-server (``--metrics``) profile.

Sources (ggml-org/llama.cpp):
- R: tools/server/README.md ("GET /metrics", Available metrics; /health)
- C: tools/server/server-context.cpp (get_metrics posts SERVER_TASK_TYPE_METRICS to the task
  queue and waits for the main loop; get_health answers from the HTTP thread)
- M: server_metrics in tools/server/server-context.cpp / server.cpp (on_prediction at slot
  release, on_prompt_eval when a prompt is processed, on_decoded per llama_decode)
- O: older examples/server/server.cpp (2024) also exported kv_cache_usage_ratio; current
  builds do not (R lists no KV gauge).

Current builds stop waiting for the loop when the server sleeps on idle and answer with cached
metrics (C); in router mode /metrics needs ``?model=`` (R: 400 without it).
"""

from engine_watchdog.engines.profile import EngineProfile

LLAMACPP = EngineProfile(
    name="llamacpp",
    series_prefix="llamacpp:",
    engine_label="",  # one unlabelled engine per server
    running=("llamacpp:requests_processing",),  # R: slots processing
    waiting=("llamacpp:requests_deferred",),  # R: tasks deferred, no slot free
    kv_usage=("llamacpp:kv_cache_usage_ratio",),  # O: older builds only
    progress={
        "decode_calls": ("llamacpp:n_decode_total",),  # R/M: +1 per llama_decode(): heartbeat
        "prompt_tokens": ("llamacpp:prompt_tokens_total",),  # M: when a prompt is processed
        "generation_tokens": ("llamacpp:tokens_predicted_total",),  # M: at slot release only
    },
    health_path="/health",
    abort_paths=(),  # no abort endpoint: closing the connection cancels the task
    process_cmdline_markers=("llama-server",),
    # One process is the HTTP server and the engine: ending it is the engine's restart.
    cmdline_roles=(("llama-server", "engine-core"),),
    metrics_in_engine_loop=True,  # C
    enable_hint="start llama-server with --metrics (without it /metrics answers 501)",
    blind_spots=(
        "/metrics is computed by the server's main loop: when that loop hangs, /metrics times "
        "out while /health keeps answering 200. Frozen counters are never seen; that pair of "
        "answers is the stall signature.",
        "tokens_predicted_total moves only when a request finishes; n_decode_total is the "
        "heartbeat.",
        "current builds export no KV-cache usage.",
        "one C++ process: no Python stacks; native stacks need gdb or eu-stack.",
    ),
)
