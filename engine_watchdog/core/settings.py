"""Every settings type, on the ground floor: frozen dataclasses with a docstring per field (the
guard's and the peer endpoint's in core/serving.py).

The command line fills them (cli/options.py: one option group per section), tests build them
directly. Nothing here does I/O; core/checks.py checks and parses what the command line gave.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine_watchdog.core.model import Action
from engine_watchdog.core.serving import GuardSettings, PeerSettings


class SettingsError(ValueError):
    """Bad input; the message names the fix. The CLI prints it as one line and exits 64."""

    exit_code = 64


class CannotWriteError(Exception):
    """A file the settings name (--record, -o) cannot be written; the message names the fix.
    The CLI prints it as one line and exits 73 (EX_CANTCREAT)."""

    exit_code = 73


class Secret:
    """A value that must never be written anywhere: ``repr`` and ``str`` hide it, and it is not
    JSON-able, so it cannot slip into a log line, a trace or /status by accident. ``reveal()``
    is for the one place that sends it (an Authorization header)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(<redacted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class ProbeSettings:
    interval_s: float = 1.0
    """Seconds between probe rounds."""
    scrape_timeout_s: float = 10.0
    """Timeout of one GET /metrics or /health. Longer than the interval is allowed."""
    max_scrape_bytes: int = 16 * 1024 * 1024
    """A /metrics body larger than this is an error (protects the watchdog's memory); the read
    stops there, it never truncates."""
    health: bool = True
    """Also poll the engine's /health (tells a dead engine from an unreachable one)."""
    health_every_round: bool = True
    """Poll /health every round; False (``check``): in the first round and after a failed
    scrape only. A one-shot verdict needs it when the metrics do not answer, and a fleet sweep
    then sends half the requests."""
    canary: bool = True
    """Send a 1-token canary request when in doubt (some operators forbid synthetic traffic)."""
    canary_timeout_s: float = 8.0
    """A canary that takes longer than this has failed."""
    procs: bool = True
    """Sample the engine's processes (state, CPU time) from the process table."""
    gpu: bool = True
    """Sample the GPUs through NVML (off by itself, said once, where there is none)."""
    pids: tuple[int, ...] = ()
    """Engine processes given explicitly; empty: found from the server's port and titles."""
    ca_file: Path | None = None
    """PEM file of the certificate authorities to trust for an https engine; None: the
    system's."""
    api_key_file: Path | None = None
    """File holding the engine's API key (vLLM's --api-key), for the canary and the abort."""
    api_key: Secret | None = None
    """The key itself, read from api_key_file or the environment by the command line (never
    from an argument: it would show in the process table)."""


@dataclass(frozen=True)
class DetectorSettings:
    stall_seconds: float = 30.0
    """Seconds without progress, while work is present, before the verdict is stalled."""
    suspect_seconds: float = 5.0
    """Seconds without progress, while work is present, before the verdict is suspect."""
    startup_grace_seconds: float = 10.0
    """No stalled verdict until this long after the first good scrape."""
    fast_stall_seconds: float = 10.0
    """With strong evidence (engine stopped, GPU spin-waiting, a failed canary): stalled after
    this many seconds without progress instead of --stall-seconds."""
    canary_after_seconds: float = 5.0
    """Ask for a canary once progress has been flat this long with work present."""
    idle_canary_seconds: float = 60.0
    """Ask for a canary this often while the engine looks idle (a wedged idle engine looks idle)."""
    stalled_canary_seconds: float = 3.0
    """Ask for a canary this often while the verdict is stalled (the guard refuses clients
    then, so no client request can prove the engine back) or while the engine looks idle and
    its last canary failed: the way out of a refusal is probed on a schedule."""
    restart_grace_seconds: float = 300.0
    """After the watchdog restarted the engine: how long it is "starting" (not dead) until it
    answers /metrics again. Past this the usual judgement resumes: engine-dead."""
    metrics_from_engine_loop: bool = False
    """The engine's /metrics is answered by its engine loop (llama.cpp's server): /metrics timing
    out for the stall window is then a stall, not an unreachable server."""
    wire_stall_seconds: float = 5.0
    """With the guard: streams open and not one event on the wire this long (or ten times the
    live 99th-percentile gap between events, if longer), the metrics flat and the engine's
    processes idle or stopped: stalled (docs/guard.md)."""
    request_stall_seconds: float = 20.0
    """With the guard: the floor of the silence after which one stream is stuck while the
    others move (the threshold is ten times the live 99th-percentile gap, if longer)."""


@dataclass(frozen=True)
class RateLimit:
    max_restarts: int = 3
    """At most this many restarts per window."""
    window_s: float = 3600.0
    """The window the limit counts over."""
    backoff_s: float = 30.0
    """After the n-th restart in the window, wait backoff_s * 2**(n-1) before the next."""


@dataclass(frozen=True)
class PolicySettings:
    actions: frozenset[Action] = frozenset({Action.CAPTURE})
    """Rungs of the ladder that may run (capture, abort, restart, liveness); empty: none."""
    dry_run: bool = False
    """Log and report every action that would be taken; take none."""
    abort_grace_s: float = 15.0
    """After an abort, seconds for progress to resume before escalating."""
    recover_timeout_s: float = 300.0
    """After a restart, seconds for the engine to come back before escalating."""
    rate_limit: RateLimit = field(default_factory=RateLimit)
    """Restart rate limit and backoff."""


@dataclass(frozen=True)
class CaptureSettings:
    incident_dir: Path = Path("incidents")
    """Where incident bundles (and the action history) go; created 0700 if missing."""
    engine_log: Path | None = None
    """The engine's log file; its tail goes into bundles."""
    tar: bool = False
    """Write bundles as ``<name>.tar.gz`` instead of a directory."""
    step_timeout_s: float = 20.0
    """Each capture step's own bound."""
    log_tail_bytes: int = 1 << 20
    """How much of the engine's log a bundle keeps."""
    keep_count: int = 20
    """Retention: at most this many bundles (oldest removed first)."""
    keep_bytes: int = 2 << 30
    """Retention: at most this many bytes of bundles in total (the newest is always kept)."""
    py_spy: str | None = None
    """The py-spy to run; None: py-spy on PATH, or beside this Python."""
    signatures: Path | None = None
    """Known-hang signature file to match bundles against; None: the one shipped."""
    pod_log: str | None = None
    """On Kubernetes: the engine container whose log bundles get through the pods/log API
    (engine.log, the last log_tail_bytes), when no engine_log file is named; None: not read."""
    pod_log_api: str = "in-cluster"
    """Where pod_log asks: "in-cluster", or an API base URL (kubectl proxy's, a test's)."""


@dataclass(frozen=True)
class RecoverySettings:
    restart_command: tuple[str, ...] = ()
    """Restart the engine with this command (no shell) instead of killing its engine core."""
    restart_timeout_s: float = 120.0
    """Bound for the restart command."""
    engine_uid: int | None = None
    """The UID the engine runs as: the watchdog kills, and accepts as ``--pid``, only processes
    of this UID. None: the watchdog's own (a root sidecar beside a non-root engine sets it)."""
    bundle_command: tuple[str, ...] = ()
    """Run this (no shell) on each finished bundle, its path the last argument: evidence off
    the node before the pod (and its emptyDir) goes."""
    bundle_command_timeout_s: float = 300.0
    """Bound for each run of the bundle command (its process group is killed past it)."""


@dataclass(frozen=True)
class ReportSettings:
    k8s_events: str | None = None
    """Post Kubernetes Events for stalls and actions: "in-cluster", or an API base URL."""
    alertmanager: str | None = None
    """Alertmanager base URL: push EngineStalled alerts there (API v2), resolve on recovery."""
    readiness_gate: str | None = None
    """Set the pod's condition engine-watchdog.io/progressing from the verdicts: "in-cluster",
    or an API base URL (the pod's readinessGates name it)."""


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


@dataclass(frozen=True)
class ProcessSettings:
    """What belongs to the process, not to each watched engine: its listening sockets and its
    event loop (one per process, whatever the number of targets)."""

    listen: str | None = "127.0.0.1:9400"
    """host:port for the watchdog's own /metrics, /livez, /readyz, /status; None: no server."""
    guard_listen: str | None = None
    """host:port of the guard, the streaming proxy in front of the (one) engine; None: no
    guard."""
    event_loop: str = "auto"
    """The process's event loop while the guard runs: uvloop, asyncio (the standard library's),
    or auto (uvloop when it is installed). uvloop costs the guard less CPU per streamed event
    (docs/performance.md); without a guard the process runs asyncio's loop."""


@dataclass(frozen=True)
class WatchSettings:
    url: str
    """Base URL of the engine's API server, e.g. http://127.0.0.1:8000, as every log, metric
    label, trace, status and history shows it: a ``user:password@`` in it is ``<redacted>@``
    (see :func:`for_target`)."""
    connect_url: str = field(default="", repr=False)
    """The URL with its credentials, used only to connect to the engine; empty: ``url``."""
    engine: str = "vllm"
    """Engine profile name (see engine_watchdog/engines), or "auto"."""
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    """How to probe."""
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    """When to call a stall."""
    policy: PolicySettings = field(default_factory=PolicySettings)
    """What to do about a stall (the escalation ladder)."""
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    """Where and how incident bundles are written."""
    recovery: RecoverySettings = field(default_factory=RecoverySettings)
    """How the engine is restarted."""
    report: ReportSettings = field(default_factory=ReportSettings)
    """Where stalls and actions are announced beyond the watchdog's own metrics."""
    guard: GuardSettings = field(default_factory=GuardSettings)
    """The guard in front of the engine (off unless it has a listen address)."""
    peers: PeerSettings = field(default_factory=PeerSettings)
    """The other nodes of a multi-node engine group (none: a single node)."""
    as_json: bool = False
    """Print each transition as a JSON line instead of a readable line."""
    record: Path | None = None
    """Append every observation to this JSON Lines trace (replayable)."""
