"""Messages between the API process and an engine core: JSON lines over a Unix socketpair.

vLLM sends msgpack over ZMQ; the simulator keeps the same shape (requests and aborts in,
per-step outputs with scheduler stats out, utility calls with replies) in a readable encoding.
Every message is one line: ``{"kind": ..., "body": {...}}``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# API -> engine core
INIT = "init"  # {"rank": int, "parent_pid": int, "settings": {...}}
ADD = "add"  # AddRequest
ABORT = "abort"  # {"request_ids": [...]}
CALL = "call"  # {"call_id": int, "method": str, "args": {...}}

# engine core -> API
READY = "ready"  # {"rank": int, "pid": int}
OUTPUTS = "outputs"  # EngineOutputs
RESULT = "result"  # {"call_id": int, "result": ...}
FAULT_STATE = "fault_state"  # pushed when an engine fault fires or ends (faults.describe)

# Utility methods the engine core answers from its input thread, so they work while the busy
# loop is blocked: the simulator's own fault control (not part of vLLM).
INPUT_THREAD_METHODS = frozenset({"set_fault"})

MAX_LINE_BYTES = 16 * 1024 * 1024
"""Largest message either side accepts (a full batch of outputs is far below this)."""


@dataclass(frozen=True)
class AddRequest:
    """A new request for the engine core's scheduler (vLLM: EngineCoreRequest)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool = False


@dataclass(frozen=True)
class TokenOutput:
    """New tokens of one request in one step (vLLM: EngineCoreOutput)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler's state after a step (vLLM: SchedulerStats)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_waiting_capacity: int = 0
    num_waiting_deferred: int = 0
    kv_cache_usage: float = 0.0
    num_preemptions: int = 0
    """Preemptions in this step (the API adds them to a counter)."""
    step_counter: int = 0


@dataclass(frozen=True)
class EngineOutputs:
    """Everything one engine step sends back (vLLM: EngineCoreOutputs)."""

    outputs: list[TokenOutput] = field(default_factory=list)
    stats: SchedulerStats = field(default_factory=SchedulerStats)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> EngineOutputs:
        return cls(
            outputs=[TokenOutput(**o) for o in body.get("outputs", [])],
            stats=SchedulerStats(**body.get("stats", {})),
        )


def encode(kind: str, body: dict[str, Any]) -> bytes:
    """One message as one line of bytes."""
    return json.dumps({"kind": kind, "body": body}, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> tuple[str, dict[str, Any]]:
    """Inverse of :func:`encode`; raises ValueError on anything else."""
    msg = json.loads(line)
    if not isinstance(msg, dict) or not isinstance(msg.get("body"), dict):
        raise ValueError(f"not a simulator message: {line[:80]!r}")
    return str(msg["kind"]), msg["body"]


LABELS = ("model_name", "engine")
"""Labels on every engine series (vLLM: model_name, and engine per data-parallel rank)."""


@dataclass(frozen=True)
class FinishedRequest:
    """A request the engine finished, as the API process saw it."""

    finish_reason: str
    e2e_latency: float
    prompt_tokens: int
    generation_tokens: int


@dataclass
class IterationStats:
    """What one batch of engine outputs did (vLLM: IterationStats, made in the API process)."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)
