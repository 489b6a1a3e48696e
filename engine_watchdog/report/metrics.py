"""The watchdog's own Prometheus metrics. Names are a contract with deploy/prometheus/rules.yml."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine_watchdog import __version__
from engine_watchdog.model import State, Transition, Verdict

PREFIX = "engine_watchdog_"
STALL_CAUSES = (
    "no-progress",
    "stopped",
    "gpu-spin",
    "host-deadlock",
    "host-busy",
    "engine-dead",
    "api-unresponsive",
    "wedged-idle",
    "admission-stall",
)


class WatchdogMetrics:
    """Every series the watchdog exports, in a registry of its own (host access passed in)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        build = Gauge(PREFIX + "build_info", "Build information.", ["version"], registry=r)
        build.labels(__version__).set(1)
        self.state = Gauge(
            PREFIX + "engine_state",
            "1 for the engine's current verdict state, 0 for the others.",
            ["target", "engine", "state"],
            registry=r,
        )
        self.stalled = Gauge(
            PREFIX + "stalled",
            "1 while the engine is judged stalled.",
            ["target", "engine"],
            registry=r,
        )
        self.without_progress = Gauge(
            PREFIX + "seconds_without_progress",
            "Seconds with work present and no progress (0 when idle or progressing).",
            ["target", "engine"],
            registry=r,
        )
        self.last_progress = Gauge(
            PREFIX + "last_progress_timestamp_seconds",
            "Unix time of the last observed progress.",
            ["target", "engine"],
            registry=r,
        )
        self.stalls = Counter(
            PREFIX + "stall_verdicts",
            "Stall verdicts by cause.",
            ["target", "engine", "cause"],
            registry=r,
        )
        self.incidents = Counter(
            PREFIX + "incidents", "Incident bundles written.", ["target", "cause"], registry=r
        )
        self.actions = Counter(
            PREFIX + "actions",
            "Recovery actions by action and result.",
            ["target", "action", "result"],
            registry=r,
        )
        self.restart_limit = Gauge(
            PREFIX + "restart_limit_reached",
            "1 once the restart rate limit stopped the watchdog from acting.",
            ["target"],
            registry=r,
        )
        self.probe_errors = Counter(
            PREFIX + "probe_errors", "Failed probes by probe.", ["target", "probe"], registry=r
        )
        self.scrape_duration = Histogram(
            PREFIX + "scrape_duration_seconds",
            "Duration of the engine /metrics scrape.",
            ["target"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.last_observation = Gauge(
            PREFIX + "last_observation_timestamp_seconds",
            "Unix time of the last successful observation by probe.",
            ["target", "probe"],
            registry=r,
        )

    def start_target(self, target: str) -> None:
        """Create every labelled counter at 0, so increase() sees the first event."""
        for cause in STALL_CAUSES:
            self.stalls.labels(target, "0", cause)
            self.incidents.labels(target, cause)
        for action in ("capture", "abort", "restart", "liveness"):
            for result in ("ok", "failed", "dry_run", "rate_limited"):
                self.actions.labels(target, action, result)
        for probe in ("metrics", "health", "canary", "gpu", "procs"):
            self.probe_errors.labels(target, probe)
        self.restart_limit.labels(target).set(0)

    def observe_probe(self, target: str, probe: str, t: float, ok: bool) -> None:
        if ok:
            self.last_observation.labels(target, probe).set(t)
        else:
            self.probe_errors.labels(target, probe).inc()

    def update(self, target: str, verdicts: dict[str, Verdict], changes: list[Transition]) -> None:
        for change in changes:
            if change.new.state is State.STALLED:
                cause = change.new.cause or "no-progress"
                self.stalls.labels(target, change.new.engine, cause).inc()
        for engine, v in verdicts.items():
            for state in State:
                self.state.labels(target, engine, state.value).set(1 if v.state is state else 0)
            self.stalled.labels(target, engine).set(1 if v.state is State.STALLED else 0)
            self.without_progress.labels(target, engine).set(v.seconds_without_progress)
            if v.last_progress_t is not None:
                self.last_progress.labels(target, engine).set(v.last_progress_t)
