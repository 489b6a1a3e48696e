"""The watchdog's own Prometheus metrics. Names are a contract with deploy/prometheus/rules.yml.

Counters count events as they happen. Everything that is a state (each engine's verdict, the
last observation of each probe, the restart limit) is read when Prometheus scrapes, by a
collector, as ``prometheus_client``'s own ``ProcessCollector`` does: nothing is pushed per round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine_watchdog import __version__
from engine_watchdog.core.model import (
    RUNGS,
    STALL_CAUSES,
    Action,
    Cause,
    Outcome,
    Reason,
    Result,
    State,
    Transition,
    Verdict,
)

PREFIX = "engine_watchdog_"
PROBES = ("metrics", "health", "canary", "gpu", "procs")
NO_SIGNATURE = "none"
COUNTED_RESULTS = (Result.OK, Result.FAILED, Result.DRY_RUN, Result.RATE_LIMITED)
"""Action results created at 0 for every target, so increase() sees the first one."""
VerdictSource = Callable[[], Mapping[str, Verdict]]


class WatchdogMetrics:
    """Every series the watchdog exports, in a registry of its own (host access passed in)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.sources: dict[str, VerdictSource] = {}
        """target -> its current verdicts, read at scrape time."""
        self.last_observation: dict[tuple[str, str], float] = {}
        self.restart_limited: dict[str, bool] = {}
        r = self.registry
        self.stalls = _counter(
            r, "stall_verdicts", "Stall verdicts by cause.", "target", "engine", "cause"
        )
        self.incidents = _counter(
            r,
            "incidents",
            "Incident bundles written, by cause and the known hang they resemble most.",
            "target",
            "cause",
            "signature",
        )
        self.actions = _counter(
            r, "actions", "Recovery actions by action and result.", "target", "action", "result"
        )
        self.probe_errors = _counter(
            r, "probe_errors", "Failed probes by probe.", "target", "probe"
        )
        self.history_write_errors = _counter(
            r,
            "history_write_errors",
            "Action-history records that could not be written to disk (recovery went on).",
            "target",
        )
        self.readiness_flips = _counter(
            r,
            "readiness_flips",
            "Flips of the pod's readiness-gate condition, by the status it flipped to "
            "(rate() of it: flaps per second).",
            "target",
            "status",
        )
        self.readiness_errors = _counter(
            r,
            "readiness_patch_errors",
            "PATCHes of the readiness-gate condition the API server did not take (tried again).",
            "target",
        )
        self.scrape_duration = Histogram(
            PREFIX + "scrape_duration_seconds",
            "Duration of the engine /metrics scrape.",
            ["target"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        r.register(_StateCollector(self))

    def start_target(self, target: str, verdicts: VerdictSource) -> None:
        """Watch ``target``; create every labelled counter at 0, so increase() sees the first."""
        self.sources[target] = verdicts
        self.restart_limited[target] = False
        for cause in STALL_CAUSES:
            self.stalls.labels(target, "0", cause)
            self.incidents.labels(target, cause, NO_SIGNATURE)
        for action in RUNGS:
            for result in COUNTED_RESULTS:
                self.actions.labels(target, action, result)
        for probe in PROBES:
            self.probe_errors.labels(target, probe)
        self.history_write_errors.labels(target)

    def start_readiness(self, target: str) -> None:
        """--readiness-gate is on for ``target``: its counters at 0."""
        for status in ("True", "False"):
            self.readiness_flips.labels(target, status)
        self.readiness_errors.labels(target)

    def observe_probe(self, target: str, probe: str, t: float, ok: bool) -> None:
        if ok:
            self.last_observation[(target, probe)] = t
        else:
            self.probe_errors.labels(target, probe).inc()

    def count_stalls(self, target: str, changes: Iterable[Transition]) -> None:
        for change in changes:
            if change.new.state is State.STALLED:
                cause = change.new.cause or Cause.NO_PROGRESS
                self.stalls.labels(target, change.new.engine, cause).inc()

    def count_incident(self, target: str, cause: Reason, signature: str) -> None:
        """A bundle was written. ``signature``: the top known-hang id, or "none"; its values
        are bounded by the signature file (docs/known-hangs.md), not by the incidents."""
        self.incidents.labels(target, cause, signature).inc()

    def count_action(self, target: str, action: Action, outcome: Outcome) -> None:
        self.actions.labels(target, action, outcome.result.replace("-", "_")).inc()
        if action is Action.RESTART:
            self.restart_limited[target] = outcome.result == Result.RATE_LIMITED


def _counter(registry: CollectorRegistry, name: str, text: str, *labels: str) -> Counter:
    return Counter(PREFIX + name, text, labels, registry=registry)


class _StateCollector(Collector):
    """The state series, built from the verdicts at scrape time."""

    def __init__(self, metrics: WatchdogMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        m, te = self.metrics, ["target", "engine"]
        build = GaugeMetricFamily(PREFIX + "build_info", "Build information.", labels=["version"])
        build.add_metric([__version__], 1)
        state = GaugeMetricFamily(
            PREFIX + "engine_state",
            "1 for the engine's current verdict state, 0 for the others.",
            labels=[*te, "state"],
        )
        stalled = GaugeMetricFamily(
            PREFIX + "stalled", "1 while the engine is judged stalled.", labels=te
        )
        quiet = GaugeMetricFamily(
            PREFIX + "seconds_without_progress",
            "Seconds with work present and no progress (0 when idle or progressing).",
            labels=te,
        )
        last = GaugeMetricFamily(
            PREFIX + "last_progress_timestamp_seconds",
            "Unix time of the last observed progress.",
            labels=te,
        )
        for target, source in list(m.sources.items()):
            for engine, v in source().items():
                for s in State:
                    state.add_metric([target, engine, s.value], 1 if v.state is s else 0)
                stalled.add_metric([target, engine], 1 if v.state is State.STALLED else 0)
                quiet.add_metric([target, engine], v.seconds_without_progress)
                if v.last_progress_t is not None:
                    last.add_metric([target, engine], v.last_progress_t)
        yield from (build, state, stalled, quiet, last, *self._probe_families())

    def _probe_families(self) -> Iterable[Metric]:
        m = self.metrics
        seen = GaugeMetricFamily(
            PREFIX + "last_observation_timestamp_seconds",
            "Unix time of the last successful observation by probe.",
            labels=["target", "probe"],
        )
        for (target, probe), t in list(m.last_observation.items()):
            seen.add_metric([target, probe], t)
        limited = GaugeMetricFamily(
            PREFIX + "restart_limit_reached",
            "1 once the restart rate limit stopped the watchdog from acting.",
            labels=["target"],
        )
        for target, flag in list(m.restart_limited.items()):
            limited.add_metric([target], 1 if flag else 0)
        return (seen, limited)
