"""Command-line options shared by several commands, and the settings they make.

Every option can also come from the environment as ENGINE_WATCHDOG_<OPTION> (a Kubernetes
ConfigMap feeds the sidecar through envFrom): :func:`env_option` names the variable.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from engine_watchdog.config import (
    ProbeSettings,
    WatchSettings,
    normalise_url,
    parse_actions,
    validate,
)
from engine_watchdog.detector import DetectorSettings
from engine_watchdog.engines import PROFILES
from engine_watchdog.recovery.history import RateLimit
from engine_watchdog.supervisor import PolicySettings

F = TypeVar("F", bound=Callable[..., Any])


def env_name(name: str) -> str:
    return "ENGINE_WATCHDOG_" + name.upper().replace("-", "_")


def env_option(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` that also reads ENGINE_WATCHDOG_<NAME>, NAME from its first long flag
    (``--stall-seconds``: ENGINE_WATCHDOG_STALL_SECONDS), and shows its default in --help
    unless ``show_default`` says otherwise."""
    flag = next(d for d in decls if d.startswith("--"))
    attrs.setdefault("envvar", env_name(flag[2:].split("/")[0]))
    if "default" in attrs:
        attrs.setdefault("show_default", True)
    return click.option(*decls, **attrs)


def _apply(options: Sequence[Callable[[F], F]], func: F) -> F:
    """Decorate ``func`` with ``options``, the first one listed first in --help."""
    for option in reversed(options):
        func = option(func)
    return func


OptionSpec = tuple[str, Any, Any, str]
"""(flag, click type or None for a ``--x/--no-x`` flag, default, help): an :func:`env_option`."""

_PROBE_SPECS: tuple[OptionSpec, ...] = (
    ("--interval", float, 1.0, "Seconds between probe rounds."),
    ("--stall-seconds", float, 30.0, "No progress this long with work present: stalled."),
    ("--suspect-seconds", float, 5.0, "No progress this long with work present: suspect."),
    ("--startup-grace", float, 10.0, "No stall verdict this long after the first scrape."),
    ("--scrape-timeout", float, 10.0, "Timeout of one /metrics or /health request."),
    (
        "--fast-stall-seconds",
        float,
        10.0,
        "Stalled this soon with strong evidence (stopped process, GPU spin, canary).",
    ),
    ("--canary/--no-canary", None, True, "Send a 1-token request when in doubt."),
    (
        "--canary-after",
        float,
        5.0,
        "Send a canary once progress has been flat this long with work present.",
    ),
    (
        "--idle-canary-interval",
        float,
        60.0,
        "Send a canary this often while the engine looks idle.",
    ),
    ("--canary-timeout", float, 8.0, "A canary slower than this has failed."),
    ("--gpu/--no-gpu", None, True, "Sample GPUs through NVML."),
)
_RESTART_SPECS: tuple[OptionSpec, ...] = (
    ("--abort-grace", float, 15.0, "Seconds for progress to resume after an abort."),
    ("--max-restarts", int, 3, "At most this many restarts per --restart-window."),
    ("--restart-window", float, 3600.0, "Seconds the restart limit counts over."),
    (
        "--restart-backoff",
        float,
        30.0,
        "Wait this, doubling per restart in the window, between restarts.",
    ),
)


def _from_specs(specs: Sequence[OptionSpec]) -> list[Callable[[F], F]]:
    return [env_option(flag, type=kind, default=d, help=text) for flag, kind, d, text in specs]


def probe_options(func: F) -> F:
    """Options shared by every command that watches an engine."""
    engine: Callable[[F], F] = env_option(
        "--engine",
        type=click.Choice(["auto", *sorted(PROFILES)]),
        default="auto",
        help="Engine profile; auto: from the first /metrics answer's series.",
    )
    pids: Callable[[F], F] = env_option(
        "--pid",
        "pids",
        type=int,
        multiple=True,
        help="Engine process (repeatable); default: found from the URL's port.",
    )
    return _apply([engine, *_from_specs(_PROBE_SPECS), pids], func)


def action_options(default_actions: str) -> Callable[[F], F]:
    """Options of the commands that may act (watch, run)."""
    options: list[Callable[[F], F]] = [
        env_option(
            "--action",
            "actions",
            multiple=True,
            default=(default_actions,),
            help="Rungs that may run: none or any of capture,abort,restart,liveness "
            "(repeatable or comma-separated; the order is fixed).",
        ),
        env_option("--dry-run", is_flag=True, help="Log actions only."),
        *_from_specs(_RESTART_SPECS),
        env_option(
            "--restart-command",
            default="",
            show_default=False,
            help="Restart the engine with this command (split like a shell, run without one).",
        ),
        *_report_options(),
    ]
    return lambda func: _apply(options, func)


def _report_options() -> list[Callable[[F], F]]:
    """Where the evidence and the news go: bundles, Kubernetes Events, Alertmanager."""
    return [
        env_option(
            "--incident-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("incidents"),
            help="Where incident bundles and the action history go.",
        ),
        env_option(
            "--engine-log",
            type=click.Path(dir_okay=False, path_type=Path),
            help="The engine's log file (its tail goes into bundles).",
        ),
        env_option("--tar", is_flag=True, help="Bundles as .tar.gz."),
        env_option(
            "--k8s-events",
            help="Post Kubernetes Events on the pod for stalls and actions: 'in-cluster' "
            "(the events-rbac component), or an API URL such as kubectl proxy's.",
        ),
        env_option(
            "--alertmanager",
            help="Alertmanager base URL: push stall alerts there (API v2), resolve on recovery.",
        ),
    ]


def policy_from(kw: dict[str, Any]) -> dict[str, Any]:
    """The WatchSettings fields that the action options fill."""
    policy = PolicySettings(
        actions=parse_actions(kw.pop("actions")),
        dry_run=kw.pop("dry_run"),
        abort_grace_s=kw.pop("abort_grace"),
        rate_limit=RateLimit(
            kw.pop("max_restarts"), kw.pop("restart_window"), kw.pop("restart_backoff")
        ),
    )
    return {
        "policy": policy,
        "incident_dir": kw.pop("incident_dir"),
        "engine_log": kw.pop("engine_log"),
        "tar": kw.pop("tar"),
        "restart_command": tuple(shlex.split(kw.pop("restart_command"))),
        "alertmanager": normalise_url(am) if (am := kw.pop("alertmanager")) else None,
        "k8s_events": _events_target(kw.pop("k8s_events")),
    }


def target_options(func: F) -> F:
    """Many engines: URLs, a targets file, or a Kubernetes label selector."""
    options: list[Callable[[F], F]] = [
        click.argument("urls", nargs=-1, envvar=env_name("url")),
        env_option(
            "--targets",
            "targets_file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="File with one engine URL per line.",
        ),
        env_option(
            "--selector",
            help="Kubernetes label selector of engine pods (asks kubectl for their IPs).",
        ),
        env_option("--namespace", help="Namespace for --selector."),
        env_option("--port", type=int, default=8000, help="Engine port for --selector pods."),
    ]
    return _apply(options, func)


def target_urls(kw: dict[str, Any]) -> list[str]:
    from engine_watchdog.targets import resolve_targets

    return resolve_targets(
        kw.pop("urls"),
        kw.pop("targets_file"),
        kw.pop("selector"),
        kw.pop("namespace"),
        kw.pop("port"),
    )


def settings_from(kw: dict[str, Any], url: str | None = None, **extra: Any) -> WatchSettings:
    probe = ProbeSettings(
        interval_s=kw["interval"],
        scrape_timeout_s=kw["scrape_timeout"],
        canary=kw["canary"],
        canary_timeout_s=kw["canary_timeout"],
        gpu=kw["gpu"],
        pids=tuple(kw["pids"]),
    )
    detector = DetectorSettings(
        stall_seconds=kw["stall_seconds"],
        suspect_seconds=kw["suspect_seconds"],
        startup_grace_seconds=kw["startup_grace"],
        fast_stall_seconds=kw["fast_stall_seconds"],
        canary_after_seconds=kw["canary_after"],
        idle_canary_seconds=kw["idle_canary_interval"],
    )
    settings = WatchSettings(
        url=normalise_url(url or kw["url"]),
        engine=kw["engine"],
        probe=probe,
        detector=detector,
        **extra,
    )
    return validate(settings)


def _events_target(value: str | None) -> str | None:
    """--k8s-events: 'in-cluster', a URL, or the ConfigMap's boolean 'true'."""
    if not value or value.lower() in ("false", "0", "no"):
        return None
    if value.lower() in ("true", "1", "yes", "in-cluster"):
        return "in-cluster"
    return normalise_url(value)
