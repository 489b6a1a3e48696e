"""The command line's values checked and parsed into settings (core/settings.py): each bad
value is refused with one :class:`SettingsError` line that names the flag and the fix. Pure: no
I/O."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlsplit

from engine_watchdog.core.model import RUNGS, Action
from engine_watchdog.core.redact import redact_url
from engine_watchdog.core.serving import REQUEST_ACTIONS, GuardSettings, PeerSettings
from engine_watchdog.core.settings import (
    EVENT_LOOPS,
    DetectorSettings,
    ProcessSettings,
    SettingsError,
    WatchSettings,
)


def parse_actions(values: tuple[str, ...]) -> frozenset[Action]:
    """--action values (repeatable, comma lists) -> rungs; 'none' alone means no action."""
    names = {n.strip() for v in values for n in v.split(",") if n.strip()}
    unknown = names - {a.value for a in RUNGS} - {"none"}
    if unknown:
        raise SettingsError(
            f"--action {', '.join(sorted(unknown))}: choose from none, {', '.join(RUNGS)}"
        )
    if "none" in names and len(names) > 1:
        raise SettingsError("--action none cannot be combined with other actions")
    return frozenset(Action(n) for n in names - {"none"})


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
    if parts.path.rstrip("/").endswith("/v1"):
        # The OpenAI API's base, as clients are configured: the engine's metrics, health and
        # API are under the server's own base (/metrics, /health, /v1/completions).
        shown = redact_url(url.rstrip("/"))
        raise SettingsError(
            f"{shown} ends in /v1, the OpenAI API's path: give the engine server's base URL, "
            f"{shown.removesuffix('/v1')} (the watchdog adds /metrics, /health and /v1/... itself)"
        )
    return url.rstrip("/")


def for_target(settings: WatchSettings, url: str) -> WatchSettings:
    """``settings`` for the engine at ``url``: validated, and redacted where it enters, so the
    credentials in it (the HTTP client sends them as basic auth) are kept only to connect."""
    full = normalise_url(url)
    shown = redact_url(full)
    return replace(settings, url=shown, connect_url=full if full != shown else "")


def parse_listen(listen: str, flag: str = "--listen") -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SettingsError(f"{flag} {listen!r}: give host:port, e.g. 127.0.0.1:9400")
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
    if p.max_scrape_bytes < 1024:
        raise SettingsError("--max-scrape-bytes must be at least 1024")
    validate_guard(settings.guard)
    if d.request_stall_seconds <= 0 or d.wire_stall_seconds <= 0:
        raise SettingsError("--request-stall-seconds and --wire-stall-seconds must be > 0")
    return replace(settings, detector=fold_thresholds(d))


def fold_thresholds(d: DetectorSettings) -> DetectorSettings:
    """Earlier thresholds beyond the stall window mean nothing: fold them into it."""
    return replace(
        d,
        suspect_seconds=min(d.suspect_seconds, d.stall_seconds),
        fast_stall_seconds=min(d.fast_stall_seconds, d.stall_seconds),
    )


def validate_process(p: ProcessSettings) -> ProcessSettings:
    if p.listen is not None:
        parse_listen(p.listen)
    if p.guard_listen is not None:
        parse_listen(p.guard_listen, "--guard-listen")
    if p.event_loop not in EVENT_LOOPS:
        raise SettingsError(f"--guard-loop {p.event_loop!r}: choose from {', '.join(EVENT_LOOPS)}")
    return p


def validate_peers(p: PeerSettings, taken: dict[int, str]) -> None:
    """The peer port is free of the other ports this node serves (``taken``: port -> flag)."""
    if not 0 < p.port < 65536:
        raise SettingsError(f"--peer-port {p.port}: must be between 1 and 65535")
    if p.port in taken:
        raise SettingsError(
            f"--peer-port {p.port} is the port of {taken[p.port]}: give the peer endpoint its own"
        )
    if p.deadline_s < 2.0:
        raise SettingsError("--peer-deadline must be at least 2 seconds")


def validate_guard(g: GuardSettings) -> None:
    if g.request_action not in REQUEST_ACTIONS:
        raise SettingsError(
            f"--request-action {g.request_action!r}: choose from {', '.join(REQUEST_ACTIONS)}"
        )
    if g.max_body_bytes < 1:
        raise SettingsError("--guard-max-body-bytes must be at least 1")
    if g.retry_after_s < 0:
        raise SettingsError("--guard-retry-after must be >= 0 seconds")
    if not 0 <= g.drain_s <= 3600:
        raise SettingsError("--guard-drain-seconds must be between 0 and 3600")
    if not 0 < g.head_timeout_s <= 3600:
        raise SettingsError("--guard-head-timeout must be > 0 and at most 3600 seconds")
    if g.max_idle_connections < 1:
        raise SettingsError("--guard-max-idle-connections must be at least 1")
