"""The simulator's /metrics in other engines' dialects: SGLang, TGI, llama.cpp, TensorRT-LLM.

Each dialect turns the engine cores' per-step outputs into the series that engine exports, with
its names, labels and types, and, what detection depends on, at the moments that engine moves
them: SGLang's token counters only when a request finishes and its gauges every 40 decode
batches; TGI's series only once touched; TensorRT-LLM's iteration gauges only when a request
completes. Sources are cited in engine_watchdog/engines/<engine>.py.

Where each engine serves them is part of the dialect too: trtllm-serve's Prometheus text is at
/prometheus/metrics with a JSON list of iteration stats at /metrics (``METRICS_PATH``,
``iteration_stats``), and llama-server computes /metrics on its engine loop, so it blocks while
the loop hangs (``METRICS_ON_ENGINE_LOOP``). The rest of the HTTP API stays vLLM's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import ClassVar

from engine_watchdog.sim.dialect_base import Dialect, Labels, families
from engine_watchdog.sim.protocol import IterationStats, SchedulerStats
from engine_watchdog.sim.settings import SimSettings


def _split(it: IterationStats | None) -> tuple[int, int]:
    """(first tokens, later tokens) of one step: prefills completed, decode tokens."""
    if it is None:
        return 0, 0
    firsts = len(it.time_to_first_tokens)
    return firsts, max(0, it.num_generation_tokens - firsts)


class SGLang(Dialect):
    """sgl-project/sglang: python/sglang/srt/metrics/collector.py and the scheduler mixins."""

    FAMILIES = families("""
        sglang:num_running_reqs gauge The number of running requests.
        sglang:num_queue_reqs gauge The number of requests in the waiting queue.
        sglang:token_usage gauge The token usage.
        sglang:gen_throughput gauge The generation throughput (token/s).
        sglang:cuda_graph_passes_total counter Total number of forward passes by CUDA graph.
        sglang:realtime_tokens_total counter Total number of tokens processed.
        sglang:prompt_tokens_total counter Number of prefill tokens processed.
        sglang:generation_tokens_total counter Number of generation tokens processed.
        sglang:num_requests_total counter Number of requests processed.
        sglang:time_to_first_token_seconds histogram Histogram of time to first token in seconds.
        sglang:inter_token_latency_seconds histogram Histogram of inter-token latency in seconds.
        sglang:e2e_request_latency_seconds histogram Histogram of End-to-end request latency
        """)
    DECODE_LOG_INTERVAL = 40  # --decode-log-interval's default
    IDLE_REFRESH_S = 30.0  # scheduler_runtime_checker_mixin.py: idle metrics every 30 s

    def __init__(self, settings: SimSettings, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(settings, clock)
        ranks = range(settings.data_parallel_size)
        self._decodes = dict.fromkeys(ranks, 0)
        self._pending = {r: [0.0, 0.0] for r in ranks}  # decode, prefill tokens since last log
        self._last_log = dict.fromkeys(ranks, clock())
        self._tok: Labels = (("model_name", settings.served_model_name),)

    def _sched(self, rank: int) -> Labels:
        model = self.settings.served_model_name
        labels = (("model_name", model), ("engine_type", "unified"), ("tp_rank", "0"))
        dp = (("dp_rank", str(rank)),) if self.settings.data_parallel_size > 1 else ()
        return (*labels, ("pp_rank", "0"), *dp)

    def step(
        self, rank: int, stats: SchedulerStats, it: IterationStats | None, interval: float
    ) -> None:
        firsts, decoded = _split(it)
        if decoded:
            self._decodes[rank] += 1
            self.inc(
                "sglang:cuda_graph_passes_total",
                (*self._sched(rank), ("mode", "decode_cuda_graph")),
            )
            self.observe("sglang:inter_token_latency_seconds", self._tok, decoded, interval)
        if it is not None:
            self._tokenizer_side(it)
            self._pending[rank][1] += it.num_prompt_tokens
        self._pending[rank][0] += decoded
        prefill_batch = it is None or firsts > 0  # a prefill chunk, or a prefill that completed
        if prefill_batch:
            # log_prefill_stats counts the batch that was already decoding, not the requests
            # this prefill brings in: those show only at the next decode log.
            self._log(rank, stats, joined=firsts)
        elif decoded and self._decodes[rank] % self.DECODE_LOG_INTERVAL == 0:
            self._log(rank, stats)

    def _tokenizer_side(self, it: IterationStats) -> None:
        ttfts = it.time_to_first_tokens
        if ttfts:
            self.observe("sglang:time_to_first_token_seconds", self._tok, len(ttfts), sum(ttfts))
        for done in it.finished:  # observe_one_finished_request: only now do these move
            self.inc("sglang:prompt_tokens_total", self._tok, done.prompt_tokens)
            self.inc("sglang:generation_tokens_total", self._tok, done.generation_tokens)
            self.inc("sglang:num_requests_total", self._tok)
            self.observe("sglang:e2e_request_latency_seconds", self._tok, 1, done.e2e_latency)

    def _log(self, rank: int, stats: SchedulerStats, joined: int = 0) -> None:
        """SchedulerMetricsCollector.log_stats: the only moment the gauges change."""
        now, labels = self.clock(), self._sched(rank)
        decoded, prefilled = self._pending[rank]
        self.set("sglang:num_running_reqs", labels, max(0, stats.num_running_reqs - joined))
        self.set("sglang:num_queue_reqs", labels, stats.num_waiting_reqs)
        self.set("sglang:token_usage", labels, round(stats.kv_cache_usage, 2))
        self.set("sglang:gen_throughput", labels, decoded / max(now - self._last_log[rank], 1e-6))
        self.inc("sglang:realtime_tokens_total", (*labels, ("mode", "decode")), decoded)
        self.inc("sglang:realtime_tokens_total", (*labels, ("mode", "prefill_compute")), prefilled)
        self._pending[rank] = [0.0, 0.0]
        self._last_log[rank] = now

    def refresh(self) -> None:
        # An idle scheduler (nothing running or queued after its last step) logs every 30 s; a
        # hung one never does, so its gauges keep their last values.
        for rank, last in self._last_log.items():
            stats = self.latest.get(rank, SchedulerStats())
            idle = stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0
            if idle and self.clock() - last >= self.IDLE_REFRESH_S:
                self._log(rank, stats)


class TGI(Dialect):
    """huggingface/text-generation-inference: backends/v3/src/{backend,queue}.rs."""

    FAMILIES = families("""
        tgi_batch_current_size gauge Current batch size
        tgi_queue_size gauge Current queue size
        tgi_batch_inference_count counter Inference calls per method (prefill or decode)
        tgi_batch_inference_success counter Number of successful inference calls per method
        tgi_batch_forward_duration histogram Batch forward duration per method
        tgi_request_success counter Number of successful requests
        tgi_request_generated_tokens histogram Generated tokens per request
        tgi_request_duration histogram Total time spent processing the request (e2e latency)
        """)
    STRIP_TOTAL = False

    def step(
        self, rank: int, stats: SchedulerStats, it: IterationStats | None, interval: float
    ) -> None:
        firsts, _ = _split(it)
        method: Labels = (("method", "prefill" if it is None or firsts else "decode"),)
        self.inc("tgi_batch_inference_count", method)
        self.inc("tgi_batch_inference_success", method)
        self.observe("tgi_batch_forward_duration", method, 1, interval)
        for done in it.finished if it else ():
            self.inc("tgi_request_success")
            self.observe("tgi_request_generated_tokens", (), 1, done.generation_tokens)
            self.observe("tgi_request_duration", (), 1, done.e2e_latency)

    def refresh(self) -> None:
        if self.latest:  # metrics-exporter-prometheus: no series before the first touch
            self.set("tgi_batch_current_size", (), self.total("num_running_reqs"))
            self.set("tgi_queue_size", (), self.total("num_waiting_reqs"))


class LlamaCpp(Dialect):
    """ggml-org/llama.cpp: tools/server (server_metrics, the /metrics handler, README)."""

    FAMILIES = families("""
        llamacpp:prompt_tokens_total counter Number of prompt tokens processed.
        llamacpp:prompt_seconds_total counter Prompt process time in seconds.
        llamacpp:tokens_predicted_total counter Number of generation tokens processed.
        llamacpp:tokens_predicted_seconds_total counter Predict process time in seconds.
        llamacpp:n_decode_total counter Total Number of llama_decode() calls.
        llamacpp:n_tokens_max counter High watermark of the context size observed.
        llamacpp:prompt_tokens_seconds gauge Average prompt throughput in tokens/s.
        llamacpp:predicted_tokens_seconds gauge Average generation throughput in tokens/s.
        llamacpp:requests_processing gauge Number of requests processing.
        llamacpp:requests_deferred gauge Number of requests deferred.
        llamacpp:n_busy_slots_per_decode gauge Average number of busy slots per llama_decode().
        """)
    STRIP_TOTAL = False
    # server-context.cpp: the /metrics handler posts SERVER_TASK_TYPE_METRICS to the server's
    # task queue and waits for the loop's answer.
    METRICS_ON_ENGINE_LOOP = True

    COUNTS: ClassVar[dict[str, tuple[str, str]]] = {
        "prompt": ("llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total"),
        "predicted": ("llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total"),
    }

    def __init__(self, settings: SimSettings, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(settings, clock)
        for name in self.FAMILIES:  # llama-server renders every series, zeros included
            self.set(name, (), 0.0)
        self._busy = 0.0
        self._bucket = {kind: [0.0, 0.0] for kind in self.COUNTS}  # tokens, seconds since scrape

    def step(
        self, rank: int, stats: SchedulerStats, it: IterationStats | None, interval: float
    ) -> None:
        self.inc("llamacpp:n_decode_total")  # on_decoded: every llama_decode(), prompts too
        self._busy += stats.num_running_reqs
        if it is None:
            return
        self._count("prompt", it.num_prompt_tokens, sum(it.time_to_first_tokens))
        for done in it.finished:  # on_prediction: at slot release only
            self._count("predicted", done.generation_tokens, done.e2e_latency)
            seen = done.prompt_tokens + done.generation_tokens
            self.set(
                "llamacpp:n_tokens_max", (), max(self.values[("llamacpp:n_tokens_max", ())], seen)
            )

    def _count(self, kind: str, tokens: float, seconds: float) -> None:
        tokens_name, seconds_name = self.COUNTS[kind]
        self.inc(tokens_name, (), tokens)
        self.inc(seconds_name, (), seconds)
        self._bucket[kind][0] += tokens
        self._bucket[kind][1] += seconds

    def refresh(self) -> None:
        for kind, gauge in (
            ("prompt", "prompt_tokens_seconds"),
            ("predicted", "predicted_tokens_seconds"),
        ):
            tokens, seconds = self._bucket[kind]
            self.set(f"llamacpp:{gauge}", (), tokens / seconds if seconds else 0.0)
            self._bucket[kind] = [0.0, 0.0]  # the metrics task resets the bucket
        self.set("llamacpp:requests_processing", (), self.total("num_running_reqs"))
        self.set("llamacpp:requests_deferred", (), self.total("num_waiting_reqs"))
        decodes = self.values[("llamacpp:n_decode_total", ())]
        self.set("llamacpp:n_busy_slots_per_decode", (), self._busy / max(decodes, 1.0))


class TrtLlm(Dialect):
    """NVIDIA/TensorRT-LLM: tensorrt_llm/metrics/collector.py, tensorrt_llm/serve/."""

    FAMILIES = families("""
        trtllm_request_success_total counter Count of successfully processed requests.
        trtllm_e2e_request_latency_seconds histogram Histogram of end to end request latency.
        trtllm_prompt_tokens_total counter Cumulative number of prompt (input) tokens processed.
        trtllm_generation_tokens_total counter Cumulative number of generation tokens produced.
        trtllm_prompt_cached_tokens_total counter Process-lifetime total prompt tokens cached.
        trtllm_kv_cache_utilization gauge KV cache utilization
        trtllm_num_requests_running gauge Number of active requests
        trtllm_num_requests_waiting gauge Number of queued requests
        trtllm_num_requests_completed_total counter Total number of completed requests
        trtllm_iteration_latency_seconds gauge Iteration latency in seconds
        """)
    LABELS: Labels = (("model_name", "undefined"), ("engine_type", "undefined"))
    # openai_server.py: Prometheus text mounted at /prometheus/metrics; /metrics is JSON.
    METRICS_PATH = "/prometheus/metrics"
    STATS_PATH = "/metrics"

    def __init__(self, settings: SimSettings, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(settings, clock)
        self.set("trtllm_prompt_cached_tokens_total", self.LABELS, 0.0)  # child made at start
        # openai_server.py buffers at most iter_stats_max_iterations (1000) iteration stats.
        self._pending: deque[tuple[int, SchedulerStats, float, int]] = deque(maxlen=1000)
        self._drained: dict[int, SchedulerStats] = {}
        self._iter = 0

    def step(
        self, rank: int, stats: SchedulerStats, it: IterationStats | None, interval: float
    ) -> None:
        finished = it.finished if it else []
        self._pending.append((rank, stats, interval, len(finished)))
        for done in finished:  # log_request_metrics_dict: per finished request
            self.inc(
                "trtllm_request_success_total",
                (*self.LABELS, ("finished_reason", done.finish_reason)),
            )
            self.observe("trtllm_e2e_request_latency_seconds", self.LABELS, 1, done.e2e_latency)
            self.inc("trtllm_prompt_tokens_total", self.LABELS, done.prompt_tokens)
            self.inc("trtllm_generation_tokens_total", self.LABELS, done.generation_tokens)
        if finished:
            self._drain()  # the iteration-stats collector wakes up only on a completion

    def iteration_stats(self) -> list[dict[str, object]]:
        """trtllm-serve's JSON /metrics: the buffered iteration stats, drained. The queue is the
        one the Prometheus collector drains, so what this takes the gauges never see."""
        out: list[dict[str, object]] = []
        for rank, stats, interval, completed in self._pending:
            self._iter += 1
            out.append(
                {
                    "iter": self._iter,
                    "iterLatencyMS": round(interval * 1000.0, 3),
                    "numActiveRequests": stats.num_running_reqs,
                    "numQueuedRequests": stats.num_waiting_reqs,
                    "numCompletedRequests": completed,
                    "kvCacheStats": {"usedNumBlocks": round(stats.kv_cache_usage * 1000)},
                    "rank": rank,
                }
            )
        self._pending.clear()
        return out

    def _drain(self) -> None:
        for rank, stats, interval, completed in self._pending:
            self._drained[rank] = stats
            self.set("trtllm_iteration_latency_seconds", self.LABELS, interval)
            self.inc("trtllm_num_requests_completed_total", self.LABELS, completed)
        self._pending.clear()
        drained = self._drained.values()
        for name, value in (
            ("num_requests_running", sum(s.num_running_reqs for s in drained)),
            ("num_requests_waiting", sum(s.num_waiting_reqs for s in drained)),
            ("kv_cache_utilization", max(s.kv_cache_usage for s in drained)),
        ):
            self.set(f"trtllm_{name}", self.LABELS, value)


DIALECT_CLASSES: dict[str, type[Dialect]] = {
    "sglang": SGLang,
    "tgi": TGI,
    "llamacpp": LlamaCpp,
    "trtllm": TrtLlm,
}


def make_dialect(settings: SimSettings) -> Dialect:
    """The dialect ``settings.dialect`` names (vLLM's own is sim/api_metrics.py, not here)."""
    return DIALECT_CLASSES[settings.dialect](settings)
