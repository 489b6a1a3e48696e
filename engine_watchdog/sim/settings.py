"""Simulator settings: one frozen dataclass, shared by the API process and its engine cores."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

FAULT_NAMES = (
    "none",
    "freeze-last",
    "deadlock",
    "spin",
    "crash",
    "slow",
    "long-prefill",
    "api-freeze",
    "stuck-request",
)
"""Every fault the simulator can inject; ``none`` clears one."""

DIALECTS = ("vllm", "sglang", "tgi", "llamacpp", "trtllm")
"""Metrics dialects the simulator can speak (see sim/dialects.py); the API stays vLLM's."""


class SimSettingsError(ValueError):
    """A setting is out of range; the message names it."""


@dataclass(frozen=True)
class SimSettings:
    """How one simulated vLLM server behaves. Defaults match ``engine-watchdog sim``."""

    host: str = "127.0.0.1"
    """Address the API server binds. Loopback by default: the simulator is a test double."""

    port: int = 8000
    """TCP port of the API server (vLLM's default)."""

    served_model_name: str = "sim-model"
    """Model id in /v1/models, in responses and in the ``model_name`` metric label."""

    tokens_per_second: float = 50.0
    """Engine steps per second. One step gives one token to every running request."""

    max_num_seqs: int = 256
    """Most requests running at once; more wait (vLLM's ``--max-num-seqs``)."""

    kv_capacity_tokens: int = 16384
    """KV-cache size in tokens. Usage = tokens held / capacity; it is also the max model length."""

    prefill_tokens_per_second: float = 8192.0
    """Prompt tokens processed per second, in one chunk per step (chunked prefill)."""

    data_parallel_size: int = 1
    """Engine-core processes, one per data-parallel rank, each with its own ``engine`` label."""

    enable_scale_out: bool = False
    """Serve ``POST /inference/v1/abort_requests``; without it the endpoint answers 403."""

    dev_mode: bool = False
    """Serve the dev endpoints (abort, pause, sleep...): what ``VLLM_SERVER_DEV_MODE=1`` does."""

    disable_log_stats: bool = False
    """No ``vllm:`` series and no periodic stats log line, like vLLM's ``--disable-log-stats``."""

    log_stats_interval: float = 10.0
    """Seconds between stats log lines (vLLM's ``VLLM_LOG_STATS_INTERVAL``)."""

    preemption: bool = True
    """Preempt (recompute) the newest running request when the KV cache is full."""

    fault: str = "none"
    """Fault armed at start-up (one of :data:`FAULT_NAMES`)."""

    freeze_last_n: int = 1
    """freeze-last: the engine freezes once at most this many requests are left in flight."""

    long_prefill_seconds: float = 60.0
    """long-prefill: seconds the next prompt's prefill takes."""

    slow_tokens_per_second: float = 0.2
    """slow: engine steps per second while the fault is on."""

    api_freeze_seconds: float = 3600.0
    """api-freeze: the API event loop stays blocked this long (or until SIGUSR2)."""

    stuck_after_tokens: int = 2
    """stuck-request: a request whose id holds ``stuck`` (its X-Request-Id) gets this many
    tokens, then no more, while it stays running and the others go on."""

    stamp_events: bool = False
    """Every streamed chunk carries ``"sim_t"``, the Unix time it was written (benchmarks)."""

    engine_start_timeout: float = 30.0
    """Seconds to wait for every engine core's handshake before giving up."""

    dialect: str = "vllm"
    """Whose /metrics to speak (one of :data:`DIALECTS`): names, labels, types and when each
    series moves follow that engine; the HTTP API stays the same."""

    gpu: bool = False
    """Engine cores do real work on CUDA device 0 through PyTorch: each step computes, a slow
    step computes for its whole length, and the spin fault spins a GPU kernel instead of the
    CPU. For rehearsing the GPU evidence on a GPU machine."""

    def __post_init__(self) -> None:
        validate(self)

    def to_wire(self) -> dict[str, Any]:
        """Plain JSON-able form, sent to each engine core at start-up."""
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> SimSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def validate(s: SimSettings) -> None:
    """Raise :class:`SimSettingsError` naming the first setting that makes no sense."""
    positive = {
        "tokens_per_second": s.tokens_per_second,
        "prefill_tokens_per_second": s.prefill_tokens_per_second,
        "log_stats_interval": s.log_stats_interval,
        "long_prefill_seconds": s.long_prefill_seconds,
        "slow_tokens_per_second": s.slow_tokens_per_second,
        "api_freeze_seconds": s.api_freeze_seconds,
        "engine_start_timeout": s.engine_start_timeout,
    }
    for name, value in positive.items():
        if not value > 0:
            raise SimSettingsError(f"{name} must be > 0, got {value}")
    at_least_one = {
        "max_num_seqs": s.max_num_seqs,
        "data_parallel_size": s.data_parallel_size,
        "freeze_last_n": s.freeze_last_n,
        "stuck_after_tokens": s.stuck_after_tokens,
    }
    for name, count in at_least_one.items():
        if count < 1:
            raise SimSettingsError(f"{name} must be >= 1, got {count}")
    if s.kv_capacity_tokens < 2:
        raise SimSettingsError(f"kv_capacity_tokens must be >= 2, got {s.kv_capacity_tokens}")
    if not 0 <= s.port <= 65535:
        raise SimSettingsError(f"port must be 0..65535, got {s.port}")
    if s.dialect not in DIALECTS:
        raise SimSettingsError(f"dialect must be one of {', '.join(DIALECTS)}, got {s.dialect!r}")
    if s.fault not in FAULT_NAMES:
        raise SimSettingsError(f"fault must be one of {', '.join(FAULT_NAMES)}, got {s.fault!r}")
