"""The shape of an engine profile. One instance per engine; nothing else names engine series."""

from __future__ import annotations

from dataclasses import dataclass, field

VLLM_TITLE_ROLES: tuple[tuple[str, str], ...] = (
    ("EngineCore", "engine-core"),
    ("Worker", "worker"),
    ("DPCoordinator", "dp-coordinator"),
    ("APIServer", "api-server"),
)
"""vLLM's title keywords (after ``VLLM::``); matched on the name so a custom prefix still works."""


@dataclass(frozen=True)
class EngineProfile:
    """What the watchdog needs to know about one serving engine."""

    name: str
    """Short engine name used in output and bundle names, e.g. ``vllm``."""

    series_prefix: str
    """Prefix every engine series starts with; used to say what a foreign /metrics holds."""

    engine_label: str
    """Label that tells data-parallel ranks apart; each rank is judged on its own."""

    running: tuple[str, ...]
    """Gauges of requests being executed (first present wins)."""

    waiting: tuple[str, ...]
    """Gauges of requests queued for admission (first present wins)."""

    kv_usage: tuple[str, ...]
    """Gauges of KV-cache usage, 0..1 (first present wins; older names later in the tuple)."""

    progress: dict[str, tuple[str, ...]]
    """Logical progress signal -> series that carry it. Any movement of any of them is progress."""

    sleep_gauge: str | None = None
    """Gauge that says the engine sleeps on purpose (no verdict while it does)."""

    sleep_awake_label: tuple[str, str] | None = None
    """(label, value) of the sleep gauge's series that is 1 while awake and 0 while asleep."""

    metrics_path: str = "/metrics"
    health_path: str = "/health"
    models_path: str = "/v1/models"
    completions_path: str = "/v1/completions"

    abort_paths: tuple[str, ...] = ()
    """Endpoints that abort requests, most preferred first."""

    process_titles: tuple[str, ...] = ()
    """Process-title prefixes of the engine's processes (setproctitle), most important first."""

    process_cmdline_markers: tuple[str, ...] = ()
    """Command-line fragments that identify the API server when it keeps its command line."""

    extra: dict[str, str] = field(default_factory=dict)
    """Free-form notes for humans (where a name came from)."""

    # -- Added for engines beyond vLLM. Every field has a default that keeps vLLM's behaviour. --

    title_roles: tuple[tuple[str, str], ...] = VLLM_TITLE_ROLES
    """(keyword, role) pairs: a process whose title matches ``process_titles`` gets the role of
    the first keyword its name after the last ``::`` starts with (roles as in ``ProcInfo``)."""

    cmdline_roles: tuple[tuple[str, str], ...] = ()
    """(fragment, role) pairs for engines that set no process title: a command line holding the
    fragment has that role (TGI's Python shards, for instance)."""

    launcher_cmdline_markers: tuple[str, ...] = ()
    """Command-line fragments of a launcher whose children are all the engine's although they are
    siblings of the API server (TGI: the launcher starts the router and the shards)."""

    gauge_progress: frozenset[str] = frozenset()
    """Keys of ``progress`` carried by gauges: any change is progress, and a decrease is not a
    restart (only counters going backwards mean that)."""

    work_gauge_lag_s: float = 0.0
    """How long the running/waiting gauges may keep a stale non-zero value after the engine went
    idle (SGLang refreshes them only every 30 s when idle). A stall verdict that relies on the
    gauges alone needs more quiet than this, or a canary."""

    progress_needs_canary: bool = False
    """Every progress series moves only when a request finishes: without a canary a long healthy
    generation cannot be told from a hang."""

    metrics_in_engine_loop: bool = False
    """/metrics is answered by the engine's own loop (llama.cpp): when the loop hangs /metrics
    times out while /health still answers 200, so that pair means a stall, not an outage."""

    health_waits_on_engine: bool = False
    """/health waits on the engine itself (SGLang: a one-token generation; TGI: every shard over
    gRPC): it takes as long as the engine does and hangs or fails with it, so it says "hung or
    dead", not only "dead", and polled every round it would hold each round for its timeout."""

    abort_all: tuple[str, str] | None = None
    """(path, JSON body) of a POST that aborts every in-flight request, where the engine has one
    with a body unlike vLLM's ``abort_paths``."""

    canary_id_format: str = "{}"
    """How the engine names a completion sent with ``X-Request-Id: {}`` (its abort takes that)."""

    enable_hint: str = ""
    """What the engine needs to export its metrics (a flag or a config key), said when they are
    missing."""

    blind_spots: tuple[str, ...] = ()
    """What the engine's metrics cannot show and how the watchdog copes, one line each."""

    def wanted_series(self) -> frozenset[str]:
        """Every series name the metrics probe must keep; all others are dropped unparsed."""
        names: set[str] = {*self.running, *self.waiting, *self.kv_usage}
        for series in self.progress.values():
            names.update(series)
        if self.sleep_gauge:
            names.add(self.sleep_gauge)
        return frozenset(names)
