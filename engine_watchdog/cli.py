"""The command line: a thin click layer over run functions. No logic lives here.

Every option can also come from the environment as ENGINE_WATCHDOG_<OPTION> (a Kubernetes
ConfigMap feeds the sidecar through envFrom). Usage errors print one line and exit 64.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from engine_watchdog import __version__
from engine_watchdog.config import (
    ProbeSettings,
    SettingsError,
    WatchSettings,
    normalise_url,
    parse_actions,
    validate,
)
from engine_watchdog.detector import DetectorSettings
from engine_watchdog.engines import PROFILES
from engine_watchdog.recovery.history import RateLimit
from engine_watchdog.supervisor import PolicySettings

EXIT_USAGE = 64
F = TypeVar("F", bound=Callable[..., Any])


def _env(name: str) -> str:
    return "ENGINE_WATCHDOG_" + name.upper().replace("-", "_")


def probe_options(func: F) -> F:
    """Options shared by every command that watches an engine."""
    options = [
        click.argument("url", envvar=_env("url")),
        click.option(
            "--engine",
            type=click.Choice(sorted(PROFILES)),
            default="vllm",
            envvar=_env("engine"),
            show_default=True,
            help="Engine profile.",
        ),
        click.option(
            "--interval",
            type=float,
            default=1.0,
            envvar=_env("interval"),
            show_default=True,
            help="Seconds between probe rounds.",
        ),
        click.option(
            "--stall-seconds",
            type=float,
            default=30.0,
            envvar=_env("stall-seconds"),
            show_default=True,
            help="No progress this long with work present: stalled.",
        ),
        click.option(
            "--suspect-seconds",
            type=float,
            default=5.0,
            envvar=_env("suspect-seconds"),
            show_default=True,
            help="No progress this long with work present: suspect.",
        ),
        click.option(
            "--startup-grace",
            type=float,
            default=10.0,
            envvar=_env("startup-grace"),
            show_default=True,
            help="No stall verdict this long after the first scrape.",
        ),
        click.option(
            "--scrape-timeout",
            type=float,
            default=10.0,
            envvar=_env("scrape-timeout"),
            show_default=True,
            help="Timeout of one /metrics or /health request.",
        ),
        click.option(
            "--fast-stall-seconds",
            type=float,
            default=10.0,
            envvar=_env("fast-stall-seconds"),
            show_default=True,
            help="Stalled this soon with strong evidence (stopped process, GPU spin, canary).",
        ),
        click.option(
            "--canary/--no-canary",
            default=True,
            envvar=_env("canary"),
            show_default=True,
            help="Send a 1-token request when in doubt.",
        ),
        click.option(
            "--canary-after",
            type=float,
            default=5.0,
            envvar=_env("canary-after"),
            show_default=True,
            help="Send a canary once progress has been flat this long with work present.",
        ),
        click.option(
            "--idle-canary-interval",
            type=float,
            default=60.0,
            envvar=_env("idle-canary-interval"),
            show_default=True,
            help="Send a canary this often while the engine looks idle.",
        ),
        click.option(
            "--canary-timeout",
            type=float,
            default=8.0,
            envvar=_env("canary-timeout"),
            show_default=True,
            help="A canary slower than this has failed.",
        ),
        click.option(
            "--gpu/--no-gpu",
            default=True,
            envvar=_env("gpu"),
            show_default=True,
            help="Sample GPUs through NVML.",
        ),
        click.option(
            "--pid",
            "pids",
            type=int,
            multiple=True,
            envvar=_env("pid"),
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
            envvar=_env("action"),
            show_default=True,
            help="Rungs that may run: none or any of capture,abort,restart,liveness "
            "(repeatable or comma-separated; the order is fixed).",
        ),
        click.option("--dry-run", is_flag=True, envvar=_env("dry-run"), help="Log actions only."),
        click.option(
            "--abort-grace",
            type=float,
            default=15.0,
            envvar=_env("abort-grace"),
            show_default=True,
            help="Seconds for progress to resume after an abort.",
        ),
        click.option(
            "--max-restarts",
            type=int,
            default=3,
            envvar=_env("max-restarts"),
            show_default=True,
            help="At most this many restarts per --restart-window.",
        ),
        click.option(
            "--restart-window",
            type=float,
            default=3600.0,
            envvar=_env("restart-window"),
            show_default=True,
            help="Seconds the restart limit counts over.",
        ),
        click.option(
            "--restart-backoff",
            type=float,
            default=30.0,
            envvar=_env("restart-backoff"),
            show_default=True,
            help="Wait this, doubling per restart in the window, between restarts.",
        ),
        click.option(
            "--restart-command",
            default="",
            envvar=_env("restart-command"),
            help="Restart the engine with this command (split like a shell, run without one).",
        ),
        click.option(
            "--incident-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("incidents"),
            envvar=_env("incident-dir"),
            show_default=True,
            help="Where incident bundles and the action history go.",
        ),
        click.option(
            "--engine-log",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar=_env("engine-log"),
            help="The engine's log file (its tail goes into bundles).",
        ),
        click.option("--tar", is_flag=True, envvar=_env("tar"), help="Bundles as .tar.gz."),
        click.option(
            "--alertmanager",
            envvar=_env("alertmanager"),
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
    }


def settings_from(kw: dict[str, Any], **extra: Any) -> WatchSettings:
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
        url=normalise_url(kw["url"]), engine=kw["engine"], probe=probe, detector=detector, **extra
    )
    return validate(settings)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="engine-watchdog")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """Catches LLM serving engines that hang silently: detect, capture, recover."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@cli.command()
@probe_options
@click.option(
    "--listen",
    default="127.0.0.1:9400",
    envvar=_env("listen"),
    show_default=True,
    help="host:port of the watchdog's /metrics /livez /readyz /status ('' for none).",
)
@click.option("--json", "json_lines", is_flag=True, envvar=_env("json"), help="JSON lines.")
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=_env("record"),
    help="Append every observation to this JSON Lines trace.",
)
@action_options("capture")
def watch(listen: str, json_lines: bool, record: Path | None, **kw: Any) -> None:
    """Watch an engine; print every state transition; act on stalls (--action)."""
    from engine_watchdog.runner import run_watch

    policy = policy_from(kw)
    settings = settings_from(
        kw, listen=listen or None, json_lines=json_lines, record=record, **policy
    )
    sys.exit(asyncio.run(run_watch(settings)))


@cli.command(context_settings={"ignore_unknown_options": True})
@probe_options
@click.option(
    "--listen",
    default="127.0.0.1:9400",
    envvar=_env("listen"),
    show_default=True,
    help="host:port of the watchdog's own endpoints ('' for none).",
)
@click.option("--json", "json_lines", is_flag=True, help="JSON lines.")
@action_options("capture,abort,restart")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(listen: str, json_lines: bool, command: tuple[str, ...], **kw: Any) -> None:
    """Start the engine (the COMMAND after --), watch it, and restart it when it hangs.

    For bare metal and Slurm: engine-watchdog run http://127.0.0.1:8000 -- vllm serve MODEL
    """
    from engine_watchdog.runner import run_watch

    policy = policy_from(kw)
    settings = settings_from(kw, listen=listen or None, json_lines=json_lines, **policy)
    sys.exit(asyncio.run(run_watch(settings, command=list(command))))


@cli.command()
@probe_options
@click.option(
    "--timeout",
    type=float,
    default=None,
    envvar=_env("timeout"),
    help="Observe at most this long [default: --stall-seconds + 10].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def check(timeout: float | None, as_json: bool, **kw: Any) -> None:
    """One-shot verdict: exit 0 healthy/idle, 1 stalled, 2 unreachable, 3 undecided."""
    from engine_watchdog.check import run_check

    settings = settings_from(kw)
    budget = timeout if timeout is not None else settings.detector.stall_seconds + 10
    result = asyncio.run(run_check(settings, budget))
    doc = result.as_dict(settings.url)
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo(f"{settings.url}: {check_line(doc)}")
    sys.exit(result.code)


def check_line(doc: dict[str, Any]) -> str:
    if doc["error"]:
        return f"{doc['state']}: {doc['error']}"
    text = str(doc["state"]) + (f" ({doc['cause']})" if doc["cause"] else "")
    return text + f", {doc['seconds_without_progress']:.1f} s without progress"


def _register_optional() -> None:
    """Commands that live next to their subsystem (sim, capture, ...)."""
    from engine_watchdog.commands import register

    register(cli)


def main(argv: list[str] | None = None) -> None:
    _register_optional()
    try:
        cli.main(args=argv, prog_name="engine-watchdog", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)
    except click.UsageError as exc:
        click.echo(f"error: {exc.format_message()} (see --help)", err=True)
        sys.exit(EXIT_USAGE)
    except (SettingsError, click.BadParameter) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        sys.exit(130)
