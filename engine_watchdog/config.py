"""Settings: frozen dataclasses with a docstring per field. The CLI fills them from flags/env."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from engine_watchdog.detector import DetectorSettings
from engine_watchdog.supervisor import RUNGS, PolicySettings


class SettingsError(ValueError):
    """Bad input; the message names the fix. The CLI prints it as one line and exits 64."""


@dataclass(frozen=True)
class ProbeSettings:
    interval_s: float = 1.0
    """Seconds between probe rounds."""
    scrape_timeout_s: float = 10.0
    """Timeout of one GET /metrics or /health. Longer than the interval is allowed."""
    max_scrape_bytes: int = 16 * 1024 * 1024
    """A /metrics body larger than this is an error (protects the watchdog's memory)."""
    health: bool = True
    """Also poll the engine's /health (tells a dead engine from an unreachable one)."""
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


@dataclass(frozen=True)
class WatchSettings:
    url: str
    """Base URL of the engine's API server, e.g. http://127.0.0.1:8000."""
    engine: str = "vllm"
    """Engine profile name (see engine_watchdog/engines)."""
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    """How to probe."""
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    """When to call a stall."""
    listen: str | None = "127.0.0.1:9400"
    """host:port for the watchdog's own /metrics, /livez, /readyz, /status; None: no server."""
    json_lines: bool = False
    """Print each transition as a JSON line instead of a readable line."""
    record: Path | None = None
    """Append every observation to this JSON Lines trace (replayable)."""
    policy: PolicySettings = field(default_factory=PolicySettings)
    """What to do about a stall (the escalation ladder)."""
    incident_dir: Path = Path("incidents")
    """Where incident bundles and the action history go."""
    engine_log: Path | None = None
    """The engine's log file; its tail goes into bundles."""
    tar: bool = False
    """Write bundles as .tar.gz."""
    restart_command: tuple[str, ...] = ()
    """Restart the engine with this command (no shell) instead of killing its engine core."""
    k8s_events: str | None = None
    """Post Kubernetes Events for stalls and actions: "in-cluster", or an API base URL."""
    alertmanager: str | None = None
    """Alertmanager base URL: push EngineStalled alerts there (API v2), resolve on recovery."""


def parse_actions(values: tuple[str, ...]) -> frozenset[str]:
    """--action values (repeatable, comma lists) -> rungs; 'none' alone means no action."""
    names = {n.strip() for v in values for n in v.split(",") if n.strip()}
    unknown = names - set(RUNGS) - {"none"}
    if unknown:
        raise SettingsError(
            f"--action {', '.join(sorted(unknown))}: choose from none, {', '.join(RUNGS)}"
        )
    if "none" in names and len(names) > 1:
        raise SettingsError("--action none cannot be combined with other actions")
    return frozenset(names - {"none"})


def normalise_url(url: str) -> str:
    """Validate an engine base URL; accept host:port without a scheme."""
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"not an engine URL: {url!r}; give one like http://127.0.0.1:8000")
    try:
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError:
        raise SettingsError(f"bad port in {url!r}; give one like http://127.0.0.1:8000") from None
    return url.rstrip("/")


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SettingsError(f"--listen {listen!r}: give host:port, e.g. 127.0.0.1:9400")
    return host.strip("[]") or "127.0.0.1", int(port)


def validate(settings: WatchSettings) -> WatchSettings:
    d, p = settings.detector, settings.probe
    if p.interval_s <= 0:
        raise SettingsError("--interval must be > 0 seconds")
    if d.stall_seconds <= 0 or d.suspect_seconds < 0:
        raise SettingsError("--stall-seconds must be > 0")
    if d.stall_seconds < 2 * p.interval_s:
        raise SettingsError("--stall-seconds must be at least twice --interval")
    if p.canary_timeout_s <= 0:
        raise SettingsError("--canary-timeout must be > 0 seconds")
    if settings.listen is not None:
        parse_listen(settings.listen)
    # Earlier thresholds beyond the stall window mean nothing: fold them into it.
    detector = replace(
        d,
        suspect_seconds=min(d.suspect_seconds, d.stall_seconds),
        fast_stall_seconds=min(d.fast_stall_seconds, d.stall_seconds),
    )
    return replace(settings, detector=detector)
