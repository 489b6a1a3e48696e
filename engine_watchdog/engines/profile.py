"""The shape of an engine profile. One instance per engine; nothing else names engine series."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def wanted_series(self) -> frozenset[str]:
        """Every series name the metrics probe must keep; all others are dropped unparsed."""
        names: set[str] = {*self.running, *self.waiting, *self.kv_usage}
        for series in self.progress.values():
            names.update(series)
        if self.sleep_gauge:
            names.add(self.sleep_gauge)
        return frozenset(names)
