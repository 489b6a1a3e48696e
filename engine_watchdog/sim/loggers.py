"""vLLM's periodic stats log line (vllm/v1/metrics/loggers.py: LoggingStatLogger).

Kept in a module named ``loggers.py`` so the log records read ``[loggers.py:NN]`` as vLLM's do.
"""

from __future__ import annotations

import logging
import time

from engine_watchdog.sim.protocol import IterationStats, SchedulerStats

logger = logging.getLogger("engine_watchdog.sim.loggers")


class LoggingStatLogger:
    """Throughput over the last interval plus the last scheduler state, for one engine rank."""

    def __init__(self, engine_index: int) -> None:
        self.engine_index = engine_index
        self.last_scheduler_stats = SchedulerStats()
        self.last_prompt_throughput = 0.0
        self.last_generation_throughput = 0.0
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self.last_log_time = now
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    def record(self, stats: SchedulerStats | None, it: IterationStats | None) -> None:
        if it is not None:
            self.num_prompt_tokens += it.num_prompt_tokens
            self.num_generation_tokens += it.num_generation_tokens
        if stats is not None:
            self.last_scheduler_stats = stats

    def log(self) -> None:
        now = time.monotonic()
        elapsed = now - self.last_log_time
        prompt = self.num_prompt_tokens / elapsed if elapsed > 0 else 0.0
        generation = self.num_generation_tokens / elapsed if elapsed > 0 else 0.0
        self._reset(now)
        log_fn = logger.info
        recent = (prompt, generation, self.last_prompt_throughput, self.last_generation_throughput)
        if not any(recent):
            # vLLM: "Avoid log noise on an idle production system". A hung engine goes quiet too.
            log_fn = logger.debug
        self.last_prompt_throughput, self.last_generation_throughput = prompt, generation
        s = self.last_scheduler_stats
        log_fn(
            "Engine %03d: Avg prompt throughput: %.1f tokens/s, "
            "Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, "
            "GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
            self.engine_index,
            prompt,
            generation,
            s.num_running_reqs,
            s.num_waiting_reqs,
            s.kv_cache_usage * 100,
            0.0,
        )
