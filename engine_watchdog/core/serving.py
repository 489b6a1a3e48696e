"""The settings of what the watchdog serves beside the engine: the guard on the data path and
the peer endpoint of a multi-node group (frozen dataclasses, a docstring per field; their
checks are in core/checks.py, the rest of the settings in core/settings.py, which holds these
in WatchSettings)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ANSWER_S = 2.0
"""The guard's drain: after ending the rest, how long their handlers get to write the error
event (guard/drain.py). Here, not there: the stop budget is computed before the stop handler
is in, and importing the guard for it (50 ms) left a Ctrl-C to asyncio's runner, which
cancelled the start and lost the signal (tests/integration/test_stopping.py)."""


REQUEST_ACTIONS = ("abort", "report")


@dataclass(frozen=True)
class GuardSettings:
    request_action: str = "abort"
    """What to do with a stuck request: abort (end it on both sides, the client gets an error)
    or report (log and count it only). --dry-run makes abort report."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Request bodies larger than this are refused (413) without reaching the engine."""
    retry_after_s: int = 5
    """The Retry-After of the 503 answers while the engine is stalled, restarting or down."""
    connect_timeout_s: float = 10.0
    """Bound on connecting to the engine (nothing else of a request is bounded by time: the
    detector and the request judge decide when a silence is too long)."""
    drain_s: float = 20.0
    """On SIGTERM: how long streams already moving may go on to their end while new requests
    are refused (503); the rest are then ended with the error event. Keep it under the pod's
    terminationGracePeriodSeconds (the chart adds a margin)."""
    head_timeout_s: float = 30.0
    """A client connection must deliver a whole request head this long after it opened (or
    after its first byte past the previous answer); else it is closed (slowloris)."""
    max_idle_connections: int = 4096
    """At most this many client connections open with no request under way; past it the
    longest idle one is closed."""
    held_limit_s: float = 21.0
    """The guard's self-check (guard/held.py): a request it holds must move, or be ended,
    within this (the per-request threshold, --request-stall-seconds, plus one probe round:
    runtime/assembly.py sets it from those)."""


@dataclass(frozen=True)
class PeerSettings:
    """Multi-node: this sidecar among the sidecars of one engine group (docs/multi-node.md).

    The group comes from ``peers`` when given, else from LeaderWorkerSet's environment; neither:
    a single node, and no peer endpoint runs."""

    peers: tuple[str, ...] = ()
    """Every node's peer endpoint as HOST:PORT, the leader first (Ray, bare metal)."""
    port: int = 9401
    """The peer endpoint's port on every node (next to the watchdog's own 9400; never the
    engine's or the guard's port)."""
    bind: str = "0.0.0.0"
    """The address the peer endpoint listens on (the other nodes must reach it)."""
    secret_file: Path | None = None
    """File holding the group's shared secret (a mounted Kubernetes Secret); else the
    ENGINE_WATCHDOG_PEER_SECRET variable. Required in a group."""
    deadline_s: float = 15.0
    """The leader's one deadline for every node's capture answer; within the capture step's
    own bound (``step_timeout_s``, 20 s, less 1 s), which the bundle writer enforces."""
