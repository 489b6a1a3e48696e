"""The command line: a thin click layer over run functions. No logic lives here.

Every option can also come from the environment as ENGINE_WATCHDOG_<OPTION> (a Kubernetes
ConfigMap feeds the sidecar through envFrom). Usage errors print one line and exit 64.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from engine_watchdog import __version__
from engine_watchdog.config import SettingsError, WatchSettings
from engine_watchdog.options import (
    F,
    action_options,
    env_name,
    policy_from,
    probe_options,
    settings_from,
    target_options,
    target_urls,
)

EXIT_USAGE = 64


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


def listen_option(func: F) -> F:
    return click.option(
        "--listen",
        default="127.0.0.1:9400",
        envvar=env_name("listen"),
        show_default=True,
        help="host:port of the watchdog's /metrics /livez /readyz /status ('' for none).",
    )(func)


@cli.command()
@target_options
@probe_options
@listen_option
@click.option("--json", "json_lines", is_flag=True, envvar=env_name("json"), help="JSON lines.")
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=env_name("record"),
    help="Append every observation to this JSON Lines trace (one engine only).",
)
@action_options("capture")
def watch(listen: str, json_lines: bool, record: Path | None, **kw: Any) -> None:
    """Watch engines; print every state transition; act on stalls (--action).

    One process can watch many engines (a per-node DaemonSet): give several URLs, --targets or
    --selector; their metrics carry a ``target`` label.
    """
    from engine_watchdog.runner import run_watch

    urls = target_urls(kw)
    if record and len(urls) > 1:
        raise SettingsError("--record takes one engine; record each engine separately")
    policy = policy_from(kw)
    extra = {"listen": listen or None, "json_lines": json_lines, "record": record, **policy}
    settings = [fleet(settings_from(dict(kw), url, **extra), len(urls)) for url in urls]
    sys.exit(asyncio.run(run_watch(settings)))


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("url", envvar=env_name("url"))
@probe_options
@listen_option
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
@target_options
@probe_options
@click.option(
    "--timeout",
    type=float,
    default=None,
    envvar=env_name("timeout"),
    help="Observe at most this long [default: --stall-seconds + 10].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def check(timeout: float | None, as_json: bool, **kw: Any) -> None:
    """One-shot verdict: exit 0 healthy/idle, 1 stalled, 2 unreachable, 3 undecided.

    Several engines are judged concurrently: one line each, a summary, the worst exit code.
    """
    from engine_watchdog.check import fleet_document, run_checks, summary_line, worst_code

    urls = target_urls(kw)
    settings = [fleet(settings_from(dict(kw), url), len(urls)) for url in urls]
    budget = timeout if timeout is not None else settings[0].detector.stall_seconds + 10
    results = asyncio.run(run_checks(settings, budget))
    docs = [r.as_dict(s.url) for r, s in zip(results, settings, strict=True)]
    code = worst_code([r.code for r in results])
    if as_json:
        click.echo(json.dumps(docs[0] if len(docs) == 1 else fleet_document(docs, code)))
    else:
        for doc in docs:
            click.echo(f"{doc['target']}: {check_line(doc)}")
        if len(docs) > 1:
            click.echo(summary_line(docs))
    sys.exit(code)


def fleet(settings: WatchSettings, count: int) -> WatchSettings:
    """With many targets, no per-target process table scan or NVML: the metrics, /health and
    the canary judge them (process and GPU evidence needs the engine on this machine)."""
    if count == 1:
        return settings
    return replace(settings, probe=replace(settings.probe, procs=False, gpu=False))


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
