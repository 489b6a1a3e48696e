"""The reporters every target has: the console's lines and the watchdog's own metrics."""

from __future__ import annotations

from collections.abc import Callable

from engine_watchdog.core.model import (
    CanaryObs,
    GpuObs,
    HealthObs,
    Observation,
    ProcsObs,
    ScrapeObs,
    State,
    Transition,
    Verdict,
    incident_id,
)
from engine_watchdog.report.console import transition_json, transition_line
from engine_watchdog.report.metrics import WatchdogMetrics
from engine_watchdog.runtime.events import Channel
from engine_watchdog.runtime.watch.watcher import Watcher


class ConsoleReporter:
    """Prints each transition as one line (readable or JSON); a JSON line names the incident
    it enters or leaves."""

    def __init__(self, as_json: bool, out: Callable[[str], None] = print) -> None:
        self.as_json = as_json
        self.out = out
        self.incidents: dict[str, str] = {}
        """engine -> the incident its stall opened, until it leaves the stall."""

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        for change in changes:
            if not self.as_json:
                self.out(transition_line(change, target))
                continue
            engine = change.new.engine
            incident: str | None
            if change.new.state is State.STALLED:
                incident = self.incidents.setdefault(engine, incident_id(change.new))
            else:
                incident = self.incidents.pop(engine, None)
            self.out(transition_json(change, target, incident))


class MetricsReporter:
    """Stall verdicts counted into the watchdog's own metrics; every probe's result as the judge
    sees it (the ``observed`` channel). The verdicts themselves are read at scrape time."""

    PROBES: dict[type, str] = {
        ScrapeObs: "metrics",
        HealthObs: "health",
        CanaryObs: "canary",
        GpuObs: "gpu",
        ProcsObs: "procs",
    }

    def __init__(
        self,
        metrics: WatchdogMetrics,
        watcher: Watcher,
        observed: Channel[Observation],
    ) -> None:
        self.metrics = metrics
        self.target = watcher.target
        metrics.start_target(watcher.target, lambda: watcher.verdicts)
        observed.subscribe(self.on_observed)

    def on_observed(self, obs: Observation) -> None:
        probe = self.PROBES.get(type(obs))
        if probe is None:
            return  # not a probe's result (a restart we made, the guard's own snapshot)
        if isinstance(obs, CanaryObs):
            ok = obs.ok
        else:
            ok = not isinstance(obs, ScrapeObs | HealthObs) or obs.error is None
        self.metrics.observe_probe(self.target, probe, obs.t, ok)
        if isinstance(obs, ScrapeObs) and obs.elapsed_s is not None:
            self.metrics.scrape_duration.labels(self.target).observe(obs.elapsed_s)

    def report(self, target: str, changes: list[Transition], verdicts: dict[str, Verdict]) -> None:
        self.metrics.count_stalls(target, changes)
