"""Command-line options shared by several commands, and the settings they make.

Every option can also come from the environment as ENGINE_WATCHDOG_<OPTION> (a Kubernetes
ConfigMap feeds the sidecar through envFrom).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
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


def probe_options(func: F) -> F:
    """Options shared by every command that watches an engine."""
    options = [
        click.option(
            "--engine",
            type=click.Choice(sorted(PROFILES)),
            default="vllm",
            envvar=env_name("engine"),
            show_default=True,
            help="Engine profile.",
        ),
        click.option(
            "--interval",
            type=float,
            default=1.0,
            envvar=env_name("interval"),
            show_default=True,
            help="Seconds between probe rounds.",
        ),
        click.option(
            "--stall-seconds",
            type=float,
            default=30.0,
            envvar=env_name("stall-seconds"),
            show_default=True,
            help="No progress this long with work present: stalled.",
        ),
        click.option(
            "--suspect-seconds",
            type=float,
            default=5.0,
            envvar=env_name("suspect-seconds"),
            show_default=True,
            help="No progress this long with work present: suspect.",
        ),
        click.option(
            "--startup-grace",
            type=float,
            default=10.0,
            envvar=env_name("startup-grace"),
            show_default=True,
            help="No stall verdict this long after the first scrape.",
        ),
        click.option(
            "--scrape-timeout",
            type=float,
            default=10.0,
            envvar=env_name("scrape-timeout"),
            show_default=True,
            help="Timeout of one /metrics or /health request.",
        ),
        click.option(
            "--fast-stall-seconds",
            type=float,
            default=10.0,
            envvar=env_name("fast-stall-seconds"),
            show_default=True,
            help="Stalled this soon with strong evidence (stopped process, GPU spin, canary).",
        ),
        click.option(
            "--canary/--no-canary",
            default=True,
            envvar=env_name("canary"),
            show_default=True,
            help="Send a 1-token request when in doubt.",
        ),
        click.option(
            "--canary-after",
            type=float,
            default=5.0,
            envvar=env_name("canary-after"),
            show_default=True,
            help="Send a canary once progress has been flat this long with work present.",
        ),
        click.option(
            "--idle-canary-interval",
            type=float,
            default=60.0,
            envvar=env_name("idle-canary-interval"),
            show_default=True,
            help="Send a canary this often while the engine looks idle.",
        ),
        click.option(
            "--canary-timeout",
            type=float,
            default=8.0,
            envvar=env_name("canary-timeout"),
            show_default=True,
            help="A canary slower than this has failed.",
        ),
        click.option(
            "--gpu/--no-gpu",
            default=True,
            envvar=env_name("gpu"),
            show_default=True,
            help="Sample GPUs through NVML.",
        ),
        click.option(
            "--pid",
            "pids",
            type=int,
            multiple=True,
            envvar=env_name("pid"),
            help="Engine process (repeatable); default: found from the URL's port.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def action_options(default_actions: str) -> Callable[[F], F]:
    """Options of the commands that may act (watch, run)."""
    options = [
        click.option(
            "--action",
            "actions",
            multiple=True,
            default=(default_actions,),
            envvar=env_name("action"),
            show_default=True,
            help="Rungs that may run: none or any of capture,abort,restart,liveness "
            "(repeatable or comma-separated; the order is fixed).",
        ),
        click.option(
            "--dry-run", is_flag=True, envvar=env_name("dry-run"), help="Log actions only."
        ),
        click.option(
            "--abort-grace",
            type=float,
            default=15.0,
            envvar=env_name("abort-grace"),
            show_default=True,
            help="Seconds for progress to resume after an abort.",
        ),
        click.option(
            "--max-restarts",
            type=int,
            default=3,
            envvar=env_name("max-restarts"),
            show_default=True,
            help="At most this many restarts per --restart-window.",
        ),
        click.option(
            "--restart-window",
            type=float,
            default=3600.0,
            envvar=env_name("restart-window"),
            show_default=True,
            help="Seconds the restart limit counts over.",
        ),
        click.option(
            "--restart-backoff",
            type=float,
            default=30.0,
            envvar=env_name("restart-backoff"),
            show_default=True,
            help="Wait this, doubling per restart in the window, between restarts.",
        ),
        click.option(
            "--restart-command",
            default="",
            envvar=env_name("restart-command"),
            help="Restart the engine with this command (split like a shell, run without one).",
        ),
        click.option(
            "--incident-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("incidents"),
            envvar=env_name("incident-dir"),
            show_default=True,
            help="Where incident bundles and the action history go.",
        ),
        click.option(
            "--engine-log",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar=env_name("engine-log"),
            help="The engine's log file (its tail goes into bundles).",
        ),
        click.option("--tar", is_flag=True, envvar=env_name("tar"), help="Bundles as .tar.gz."),
        click.option(
            "--k8s-events",
            envvar=env_name("k8s-events"),
            help="Post Kubernetes Events on the pod for stalls and actions: 'in-cluster' "
            "(the events-rbac component), or an API URL such as kubectl proxy's.",
        ),
        click.option(
            "--alertmanager",
            envvar=env_name("alertmanager"),
            help="Alertmanager base URL: push stall alerts there (API v2), resolve on recovery.",
        ),
    ]

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


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
    options = [
        click.argument("urls", nargs=-1, envvar=env_name("url")),
        click.option(
            "--targets",
            "targets_file",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar=env_name("targets"),
            help="File with one engine URL per line.",
        ),
        click.option(
            "--selector",
            envvar=env_name("selector"),
            help="Kubernetes label selector of engine pods (asks kubectl for their IPs).",
        ),
        click.option("--namespace", envvar=env_name("namespace"), help="Namespace for --selector."),
        click.option(
            "--port",
            type=int,
            default=8000,
            envvar=env_name("port"),
            show_default=True,
            help="Engine port for --selector pods.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


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
