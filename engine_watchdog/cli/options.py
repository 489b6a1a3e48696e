"""The option groups of the commands, one per settings section, and the WatchSettings they
build together (cli/option_group.py has the machinery). In the order a reader meets them: what
is watched and how it is judged (ENGINE, PROBE, DETECTOR); what the process says and where
(REPORT, PROCESS, PEERS, JSON, RECORD); what is done about a stall (POLICY, RECOVERY, CAPTURE,
GUARD); then the commands' lists of groups and the settings they build.

Every option can also come from the environment as ENGINE_WATCHDOG_<OPTION> (a Kubernetes
ConfigMap feeds the sidecar through envFrom).
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from engine_watchdog.cli.numbers import POSITIVE, SECONDS
from engine_watchdog.cli.option_group import One, Opt, OptionGroup, all_consumed, named_by_source
from engine_watchdog.core.checks import (
    for_target,
    normalise_url,
    parse_actions,
    validate,
    validate_process,
)
from engine_watchdog.core.model import RUNGS
from engine_watchdog.core.serving import REQUEST_ACTIONS, GuardSettings, PeerSettings
from engine_watchdog.core.settings import (
    EVENT_LOOPS,
    CaptureSettings,
    DetectorSettings,
    PolicySettings,
    ProbeSettings,
    ProcessSettings,
    RecoverySettings,
    ReportSettings,
    SettingsError,
    WatchSettings,
)
from engine_watchdog.host import logs
from engine_watchdog.net.access import load_api_key, tls_context


def _pids(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(values)


def _ca_file(path: Path) -> Path:
    tls_context(path)  # a file that cannot be loaded is a usage error now, not a probe error later
    return path


def _engine_names() -> list[str]:
    from engine_watchdog.engines import PROFILES

    return ["auto", *sorted(PROFILES)]


ENGINE = One(
    Opt(
        "--engine",
        "engine",
        "Engine profile; auto: from the first /metrics answer's series.",
        click.Choice(_engine_names()),
    ),
    default="auto",
)


PROBE = OptionGroup(
    ProbeSettings,
    Opt("--interval", "interval_s", "Seconds between probe rounds.", POSITIVE),
    Opt(
        "--scrape-timeout",
        "scrape_timeout_s",
        "Timeout of one /metrics or /health request.",
        POSITIVE,
    ),
    Opt("--canary/--no-canary", "canary", "Send a 1-token request when in doubt."),
    Opt("--canary-timeout", "canary_timeout_s", "A canary slower than this has failed.", POSITIVE),
    Opt("--gpu/--no-gpu", "gpu", "Sample GPUs through NVML."),
    Opt(
        "--pid",
        "pids",
        "Engine process (repeatable); default: found from the URL's port.",
        int,
        multiple=True,
        convert=_pids,
    ),
    Opt(
        "--max-scrape-bytes",
        "max_scrape_bytes",
        "A /metrics body larger than this is an error (the read stops there).",
        int,
    ),
    Opt(
        "--ca-file",
        "ca_file",
        "PEM file of the CA(s) to trust for an https engine (default: the system's).",
        click.Path(dir_okay=False, path_type=Path),
        convert=_ca_file,
    ),
    Opt(
        "--api-key-file",
        "api_key_file",
        "File holding the engine's API key (vLLM --api-key) for the canary and the abort; "
        "else ENGINE_WATCHDOG_API_KEY, else VLLM_API_KEY. Never give the key as an argument.",
        click.Path(dir_okay=False, path_type=Path),
    ),
)
DETECTOR = OptionGroup(
    DetectorSettings,
    Opt(
        "--stall-seconds",
        "stall_seconds",
        "No progress this long with work present: stalled.",
        POSITIVE,
    ),
    Opt(
        "--suspect-seconds",
        "suspect_seconds",
        "No progress this long with work present: suspect.",
        SECONDS,
    ),
    Opt(
        "--startup-grace",
        "startup_grace_seconds",
        "No stall verdict this long after the first scrape.",
        SECONDS,
    ),
    Opt(
        "--fast-stall-seconds",
        "fast_stall_seconds",
        "Stalled this soon with strong evidence (stopped process, GPU spin, canary).",
        SECONDS,
    ),
    Opt(
        "--canary-after",
        "canary_after_seconds",
        "Send a canary once progress has been flat this long with work present.",
        SECONDS,
    ),
    Opt(
        "--idle-canary-interval",
        "idle_canary_seconds",
        "Send a canary this often while the engine looks idle.",
        POSITIVE,
    ),
    Opt(
        "--stalled-canary-interval",
        "stalled_canary_seconds",
        "Send a canary this often while stalled, or idle after a failed canary (the way out).",
        float,
    ),
    Opt(
        "--wire-stall-seconds",
        "wire_stall_seconds",
        "With the guard: no event on the wire this long, streams open, the engine idle or "
        "stopped: stalled.",
        POSITIVE,
    ),
    Opt(
        "--request-stall-seconds",
        "request_stall_seconds",
        "With the guard: one stream silent this long (at least) while the others move: stuck.",
        POSITIVE,
    ),
)


def api_target(value: str) -> str | None:
    """--k8s-events, --readiness-gate, --pod-log-api: 'in-cluster', a URL, or the ConfigMap's
    boolean 'true'."""
    if not value or value.lower() in ("false", "0", "no"):
        return None
    if value.lower() in ("true", "1", "yes", "in-cluster"):
        return "in-cluster"
    return normalise_url(value)


REPORT = OptionGroup(
    ReportSettings,
    Opt(
        "--k8s-events",
        "k8s_events",
        "Post Kubernetes Events on the pod for stalls and actions: 'in-cluster' "
        "(the events-rbac component), or an API URL such as kubectl proxy's.",
        str,
        convert=api_target,
    ),
    Opt(
        "--readiness-gate",
        "readiness_gate",
        "Set this pod's condition engine-watchdog.io/progressing (False while stalled, True "
        "otherwise) for its readinessGates: 'in-cluster' (the readiness-gate component), or an "
        "API URL. Off by default.",
        str,
        convert=api_target,
    ),
    Opt(
        "--alertmanager",
        "alertmanager",
        "Alertmanager base URL: push stall alerts there (API v2), resolve on recovery.",
        str,
        convert=lambda url: normalise_url(url) if url else None,
    ),
)


PROCESS = OptionGroup(
    ProcessSettings,
    Opt(
        "--listen",
        "listen",
        "host:port of the watchdog's /metrics /livez /readyz /status ('' for none).",
        str,
        convert=lambda text: text or None,
    ),
    Opt(
        "--guard-listen",
        "guard_listen",
        "host:port of the guard, the streaming proxy in front of the engine (clients connect "
        "there); unset: no guard.",
        str,
        convert=lambda text: text or None,
    ),
    Opt(
        "--guard-loop",
        "event_loop",
        "The event loop while the guard runs; auto: uvloop when installed.",
        click.Choice(EVENT_LOOPS),
    ),
)
"""The process's own options: its sockets and its loop, whatever the number of engines."""


def _peer_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


PEERS = OptionGroup(
    PeerSettings,
    Opt(
        "--peers",
        "peers",
        "Multi-node: every node's peer endpoint, HOST:PORT,HOST:PORT, the leader first (Ray, "
        "bare metal) [default: from LeaderWorkerSet's LWS_* variables, else a single node].",
        str,
        convert=_peer_list,
        default="",
    ),
    Opt(
        "--peer-port",
        "port",
        "This node's peer endpoint port (on LeaderWorkerSet every node the same).",
        int,
    ),
    Opt("--peer-bind", "bind", "The address the peer endpoint listens on.", str),
    Opt(
        "--peer-secret-file",
        "secret_file",
        "File holding the group's shared secret (a mounted Secret); else "
        "ENGINE_WATCHDOG_PEER_SECRET. Never give the secret as an argument.",
        click.Path(dir_okay=False, path_type=Path),
    ),
    Opt(
        "--peer-deadline",
        "deadline_s",
        "The leader's one deadline for every node's capture answer.",
        POSITIVE,
    ),
)


def _json_logs(ctx: click.Context, param: click.Parameter, as_json: bool) -> bool:
    """--json: every line from here on is JSON, log lines and the error a bad option ends with
    included (an eager option: read before the others)."""
    if as_json:
        logs.configure(True)
    return as_json


JSON = One(
    Opt(
        "--json",
        "as_json",
        "Print JSON: one object a line for watch, run and guard, their log lines included.",
        callback=_json_logs,
        eager=True,
    ),
    False,
)
RECORD = One(
    Opt(
        "--record",
        "record",
        "Append every observation to this JSON Lines trace (one engine only).",
        click.Path(dir_okay=False, path_type=Path),
    )
)


def checked_signatures(path: Path) -> Path:
    """A signature file that loads, or a usage error naming what is wrong with it (at start,
    not at the first incident)."""
    from engine_watchdog.cli.hangscmd import signatures_or_exit

    signatures_or_exit(path)
    return path


def _bundle_command(text: str) -> tuple[str, ...]:
    """A program that is not there is a usage error at start, not a failed upload at the first
    incident (hours later, the evidence already gone with the pod)."""
    argv = tuple(shlex.split(text))
    if argv and shutil.which(argv[0]) is None:
        raise SettingsError(
            f"--bundle-command {argv[0]!r} is not an executable program: give a path, or a "
            "name on PATH"
        )
    return argv


POLICY = OptionGroup(
    PolicySettings,
    Opt(
        "--action",
        "actions",
        f"Rungs that may run: none or any of {','.join(RUNGS)} (repeatable or "
        "comma-separated; the order is fixed; answer acts through the guard).",
        multiple=True,
        convert=parse_actions,
        default=("capture",),
    ),
    Opt("--dry-run", "dry_run", "Log actions only."),
    Opt(
        "--abort-grace", "abort_grace_s", "Seconds for progress to resume after an abort.", SECONDS
    ),
    Opt(
        "--max-restarts",
        "rate_limit.max_restarts",
        "At most this many restarts per --restart-window.",
        int,
    ),
    Opt(
        "--restart-window",
        "rate_limit.window_s",
        "Seconds the restart limit counts over.",
        POSITIVE,
    ),
    Opt(
        "--restart-backoff",
        "rate_limit.backoff_s",
        "Wait this, doubling per restart in the window, between restarts.",
        SECONDS,
    ),
)
GUARD = OptionGroup(
    GuardSettings,
    Opt(
        "--request-action",
        "request_action",
        "A stuck request: abort it (its client gets an error) or only report it.",
        click.Choice(REQUEST_ACTIONS),
    ),
    Opt(
        "--guard-max-body-bytes",
        "max_body_bytes",
        "Refuse (413) request bodies larger than this.",
        int,
    ),
    Opt(
        "--guard-retry-after",
        "retry_after_s",
        "Retry-After (seconds) of the guard's 503 answers.",
        int,
    ),
    Opt(
        "--guard-drain-seconds",
        "drain_s",
        "On SIGTERM: let moving streams finish this long (new requests get 503), then end "
        "the rest; keep it under the pod's grace period.",
        float,
    ),
    Opt(
        "--guard-head-timeout",
        "head_timeout_s",
        "Close a client connection that has not sent a whole request head this many seconds "
        "after it opened (slowloris).",
        float,
    ),
    Opt(
        "--guard-max-idle-connections",
        "max_idle_connections",
        "At most this many idle client connections; past it the longest idle is closed.",
        int,
    ),
)
RECOVERY = OptionGroup(
    RecoverySettings,
    Opt(
        "--restart-command",
        "restart_command",
        "Restart the engine with this command (split like a shell, run without one).",
        str,
        convert=lambda text: tuple(shlex.split(text)),
        default="",
    ),
    Opt(
        "--bundle-command",
        "bundle_command",
        "Run this on each finished bundle, its path the last argument (split like a shell, "
        "run without one), e.g. to copy it to object storage.",
        str,
        convert=_bundle_command,
        default="",
    ),
    Opt(
        "--bundle-command-timeout",
        "bundle_command_timeout_s",
        "Seconds each --bundle-command run may take; then its process group is killed.",
        POSITIVE,
    ),
    Opt(
        "--engine-uid",
        "engine_uid",
        "The engine's UID: only its processes are killed or taken as --pid [default: the "
        "watchdog's own].",
        click.IntRange(min=0),
    ),
)
PY_SPY_OPT = Opt(
    "--py-spy", "py_spy", "The py-spy to run [default: on PATH, or beside this Python].", str
)
INCIDENT_DIR_OPT = Opt(
    "--incident-dir",
    "incident_dir",
    "Where incident bundles and the action history go.",
    click.Path(file_okay=False, path_type=Path),
)
CAPTURE = OptionGroup(
    CaptureSettings,
    INCIDENT_DIR_OPT,
    Opt(
        "--engine-log",
        "engine_log",
        "The engine's log file (its tail goes into bundles).",
        click.Path(dir_okay=False, path_type=Path),
    ),
    Opt(
        "--pod-log",
        "pod_log",
        "On Kubernetes: the engine container whose log bundles get through the API's pods/log "
        "(the pod-log component grants it), when --engine-log names no file.",
        str,
        convert=lambda name: name or None,
    ),
    Opt(
        "--pod-log-api",
        "pod_log_api",
        "Where --pod-log asks: 'in-cluster', or an API URL such as kubectl proxy's.",
        str,
        convert=lambda where: api_target(where) or "in-cluster",
    ),
    Opt("--tar", "tar", "Bundles as .tar.gz."),
    Opt(
        "--signatures",
        "signatures",
        "Known-hang signature file bundles are matched against [default: the one shipped].",
        click.Path(dir_okay=False, path_type=Path),
        convert=checked_signatures,
    ),
    PY_SPY_OPT,
)


__all__ = [
    "CAPTURE",
    "DETECTOR",
    "ENGINE",
    "GUARD",
    "INCIDENT_DIR_OPT",
    "JSON",
    "PEERS",
    "POLICY",
    "PROBE",
    "PROCESS",
    "PY_SPY_OPT",
    "RECORD",
    "RECOVERY",
    "REPORT",
    "for_each",
    "process_settings",
    "watch_settings",
]


def watch_settings(kw: dict[str, Any], url: str = "") -> WatchSettings:
    """The WatchSettings the option groups a command declared say (the rest: defaults)."""
    settings = WatchSettings(
        url="",
        engine=ENGINE.take(kw),
        probe=_with_api_key(PROBE.take(kw)),
        detector=DETECTOR.take(kw),
        policy=POLICY.take(kw),
        capture=CAPTURE.take(kw),
        recovery=RECOVERY.take(kw),
        report=REPORT.take(kw),
        guard=GUARD.take(kw),
        peers=PEERS.take(kw),
    )
    for one, name in ((JSON, "as_json"), (RECORD, "record")):
        if one.opt.dest in kw:
            settings = replace(settings, **{name: one.take(kw)})
    all_consumed(kw)
    return for_target(settings, url) if url else settings


def process_settings(kw: dict[str, Any]) -> ProcessSettings:
    """The process's settings from its options (taken off ``kw`` before :func:`watch_settings`)."""
    return validate_process(PROCESS.take(kw))


def _with_api_key(probe: ProbeSettings) -> ProbeSettings:
    """The engine's API key, from --api-key-file or the environment (read once, at start)."""
    with named_by_source("--api-key-file", "api_key_file"):
        return replace(probe, api_key=load_api_key(probe.api_key_file))


def for_each(base: WatchSettings, urls: list[str]) -> list[WatchSettings]:
    """One settings per engine; with many, no per-target process table scan or NVML: the
    metrics, /health and the canary judge them (process and GPU evidence needs the engine on
    this machine)."""
    many = len(urls) > 1
    probe = replace(base.probe, procs=False, gpu=False) if many else base.probe
    return [validate(for_target(replace(base, probe=probe), u)) for u in urls]
