"""The command line: a thin click layer over run functions. No logic lives here.

Every option can also come from the environment as ENGINE_WATCHDOG_<OPTION> (a Kubernetes
ConfigMap feeds the sidecar through envFrom). Usage errors print one line and exit 64.
"""

from __future__ import annotations

import asyncio
import json
import logging
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
    validate,
)
from engine_watchdog.detector import DetectorSettings
from engine_watchdog.engines import PROFILES

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
            default=5.0,
            envvar=_env("scrape-timeout"),
            show_default=True,
            help="Timeout of one /metrics or /health request.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def settings_from(kw: dict[str, Any], **extra: Any) -> WatchSettings:
    return validate(
        WatchSettings(
            url=normalise_url(kw["url"]),
            engine=kw["engine"],
            probe=ProbeSettings(interval_s=kw["interval"], scrape_timeout_s=kw["scrape_timeout"]),
            detector=DetectorSettings(
                stall_seconds=kw["stall_seconds"],
                suspect_seconds=kw["suspect_seconds"],
                startup_grace_seconds=kw["startup_grace"],
            ),
            **extra,
        )
    )


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
def watch(listen: str, json_lines: bool, record: Path | None, **kw: Any) -> None:
    """Watch an engine; print every state transition."""
    from engine_watchdog.runner import run_watch

    settings = settings_from(kw, listen=listen or None, json_lines=json_lines, record=record)
    sys.exit(asyncio.run(run_watch(settings)))


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
    text = doc["state"] + (f" ({doc['cause']})" if doc["cause"] else "")
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
