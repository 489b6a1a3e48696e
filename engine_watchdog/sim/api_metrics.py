"""The API process's Prometheus metrics, with vLLM's names, labels and types.

As in vLLM, the API process owns the metrics and updates them from engine-core outputs, so when
an engine core hangs, /metrics still answers with every value frozen at its last update. Metric
definitions follow vllm/v1/metrics/loggers.py (PrometheusStatLogger). The registry is private:
a simulator never touches prometheus_client's global one.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from engine_watchdog.sim.dialect_base import Dialect
from engine_watchdog.sim.dialects import make_dialect
from engine_watchdog.sim.protocol import LABELS, IterationStats, SchedulerStats
from engine_watchdog.sim.settings import SimSettings

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
BLOCK_SIZE = 16
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0),
    *(7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
E2E_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)


def build_1_2_5_buckets(limit: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's buckets for token counts)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return out
            out.append(float(value))
        exponent += 1


class _Engine:
    """The series of one engine rank (labels already bound)."""

    def __init__(self, fam: _Families, model: str, rank: int) -> None:
        lv = (model, str(rank))
        self.running = fam.running.labels(*lv)
        self.waiting = fam.waiting.labels(*lv)
        self.waiting_by_reason = {
            r: fam.waiting_by_reason.labels(*lv, r) for r in ("capacity", "deferred")
        }
        self.kv_usage = fam.kv_usage.labels(*lv)
        self.sleep_state = {s: fam.sleep_state.labels(*lv, s) for s in SLEEP_STATES}
        self.preemptions = fam.preemptions.labels(*lv)
        self.prompt_tokens = fam.prompt_tokens.labels(*lv)
        self.generation_tokens = fam.generation_tokens.labels(*lv)
        self.success = {r: fam.success.labels(*lv, r) for r in FINISH_REASONS}
        self.iteration_tokens = fam.iteration_tokens.labels(*lv)
        self.ttft = fam.ttft.labels(*lv)
        self.e2e = fam.e2e.labels(*lv)
        self.request_prompt = fam.request_prompt.labels(*lv)
        self.request_generation = fam.request_generation.labels(*lv)
        self.sleep_state["awake"].set(1)


class _Families:
    """Every vllm: metric family, registered in one private registry."""

    def __init__(self, reg: CollectorRegistry, max_model_len: int) -> None:
        self._gauges(reg)
        self._counters(reg)
        self._histograms(reg, build_1_2_5_buckets(max_model_len))

    def _gauges(self, reg: CollectorRegistry) -> None:
        self.running = _gauge(
            reg, "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = _gauge(
            reg, "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.waiting_by_reason = _gauge(
            reg,
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting to be processed, by reason.",
            "reason",
        )
        self.kv_usage = _gauge(
            reg, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.sleep_state = _gauge(
            reg,
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; "
            "discard_all = 1 means sleep level 2.",
            "sleep_state",
        )

    def _counters(self, reg: CollectorRegistry) -> None:
        # prometheus_client adds "_total": vllm:generation_tokens -> vllm:generation_tokens_total.
        self.preemptions = _counter(
            reg, "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = _counter(
            reg, "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.generation_tokens = _counter(
            reg, "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.success = _counter(
            reg,
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
        )

    def _histograms(self, reg: CollectorRegistry, token_buckets: list[float]) -> None:
        # The name really ends in _total: the series are vllm:iteration_tokens_total_count, ...
        self.iteration_tokens = _histogram(
            reg,
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_BUCKETS,
        )
        self.ttft = _histogram(
            reg,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.e2e = _histogram(
            reg,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
        )
        self.request_prompt = _histogram(
            reg, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation = _histogram(
            reg,
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )


def _gauge(reg: CollectorRegistry, name: str, doc: str, *extra: str) -> Gauge:
    return Gauge(name, doc, [*LABELS, *extra], registry=reg)


def _counter(reg: CollectorRegistry, name: str, doc: str, *extra: str) -> Counter:
    return Counter(name, doc, [*LABELS, *extra], registry=reg)


def _histogram(reg: CollectorRegistry, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
    return Histogram(name, doc, list(LABELS), registry=reg, buckets=buckets)


class SimMetrics:
    """The API process's registry: process metrics always, vllm: series unless disabled."""

    def __init__(self, settings: SimSettings) -> None:
        self.registry = CollectorRegistry()
        self._engines: dict[int, _Engine] = {}
        self._dialect: Dialect | None = None
        if settings.dialect != "vllm":
            self._dialect = make_dialect(settings)
            return
        # vLLM exports the default collectors too (it uses the global registry).
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        if settings.disable_log_stats:
            return
        fam = _Families(self.registry, settings.kv_capacity_tokens)
        ranks = range(settings.data_parallel_size)
        self._engines = {r: _Engine(fam, settings.served_model_name, r) for r in ranks}
        _cache_config_info(self.registry, settings, ranks)

    def record(self, rank: int, stats: SchedulerStats, it: IterationStats | None) -> None:
        """Update one rank's series from an engine output batch (vLLM: record())."""
        if self._dialect is not None:
            self._dialect.record(rank, stats, it)
            return
        e = self._engines.get(rank)
        if e is None:
            return
        e.running.set(stats.num_running_reqs)
        e.waiting.set(stats.num_waiting_reqs)
        e.waiting_by_reason["capacity"].set(stats.num_waiting_capacity)
        e.waiting_by_reason["deferred"].set(stats.num_waiting_deferred)
        e.kv_usage.set(stats.kv_cache_usage)
        e.preemptions.inc(stats.num_preemptions)
        if it is None:
            return
        e.prompt_tokens.inc(it.num_prompt_tokens)
        e.generation_tokens.inc(it.num_generation_tokens)
        e.iteration_tokens.observe(it.num_prompt_tokens + it.num_generation_tokens)
        for ttft in it.time_to_first_tokens:
            e.ttft.observe(ttft)
        for done in it.finished:
            e.success[done.finish_reason].inc()
            e.e2e.observe(done.e2e_latency)
            e.request_prompt.observe(done.prompt_tokens)
            e.request_generation.observe(done.generation_tokens)

    def set_sleep_level(self, rank: int, level: int) -> None:
        """0 awake, 1 weights offloaded, 2 everything discarded (vLLM's sleep levels)."""
        e = self._engines.get(rank)
        if e is not None:
            for i, state in enumerate(SLEEP_STATES):
                e.sleep_state[state].set(1 if i == level else 0)

    @property
    def metrics_path(self) -> str:
        """Where this engine serves its Prometheus text (trtllm-serve: /prometheus/metrics)."""
        return self._dialect.METRICS_PATH if self._dialect is not None else "/metrics"

    @property
    def on_engine_loop(self) -> bool:
        """The /metrics handler must wait for the engine loop (llama.cpp)."""
        return self._dialect is not None and self._dialect.METRICS_ON_ENGINE_LOOP

    @property
    def stats_path(self) -> str | None:
        """Where the engine serves JSON iteration stats (trtllm-serve: /metrics), if anywhere."""
        return self._dialect.STATS_PATH if self._dialect is not None else None

    def iteration_stats(self) -> list[dict[str, object]]:
        """The JSON iteration stats at ``stats_path``, drained."""
        return self._dialect.iteration_stats() if self._dialect is not None else []

    def exposition(self) -> bytes:
        if self._dialect is not None:
            return self._dialect.exposition()
        return generate_latest(self.registry)


def _cache_config_info(reg: CollectorRegistry, s: SimSettings, ranks: range) -> None:
    info = {
        "block_size": str(BLOCK_SIZE),
        "cache_dtype": "auto",
        "enable_prefix_caching": "False",
        "gpu_memory_utilization": "0.9",
        "num_gpu_blocks": str(s.kv_capacity_tokens // BLOCK_SIZE),
    }
    gauge = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        [*info, "engine"],
        registry=reg,
    )
    for rank in ranks:
        gauge.labels(**info, engine=str(rank)).set(1)
