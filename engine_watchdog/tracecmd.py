"""``record`` and ``replay`` commands."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from engine_watchdog.detector import DetectorSettings
from engine_watchdog.engines import PROFILES
from engine_watchdog.options import probe_options, settings_from
from engine_watchdog.replay import replay as run_replay
from engine_watchdog.replay import replay_document
from engine_watchdog.report.console import transition_line


@click.command()
@click.argument("url")
@probe_options
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Trace file to append to (JSON Lines).",
)
@click.option("--duration", type=float, default=60.0, show_default=True, help="Seconds to record.")
def record(output: Path, duration: float, **kw: Any) -> None:
    """Record observations of an engine into a replayable trace."""
    from engine_watchdog.runner import ConsoleReporter, probe_loop
    from engine_watchdog.trace import TraceWriter
    from engine_watchdog.watcher import Watcher

    settings = settings_from(kw, listen=None)
    rounds = max(1, round(duration / settings.probe.interval_s))

    async def go() -> None:
        import aiohttp

        writer = TraceWriter(output)
        try:
            async with aiohttp.ClientSession() as session:
                watcher = Watcher(settings, session)
                watcher.listeners.append(writer.write)
                await probe_loop(watcher, [ConsoleReporter(False, click.echo)], rounds)
        finally:
            writer.close()

    asyncio.run(go())
    click.echo(f"recorded {rounds} rounds to {output}")


@click.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--engine", type=click.Choice(sorted(PROFILES)), default="vllm", show_default=True)
@click.option("--stall-seconds", type=float, default=30.0, show_default=True)
@click.option("--suspect-seconds", type=float, default=5.0, show_default=True)
@click.option("--startup-grace", type=float, default=10.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def replay(
    trace: Path,
    engine: str,
    stall_seconds: float,
    suspect_seconds: float,
    startup_grace: float,
    as_json: bool,
) -> None:
    """Run the detector over a recorded trace and print the verdict transitions."""
    settings = DetectorSettings(stall_seconds, suspect_seconds, startup_grace)
    with trace.open(encoding="utf-8", errors="replace") as lines:
        changes = run_replay(lines, PROFILES[engine], settings)
    if as_json:
        click.echo(json.dumps(replay_document(changes)))
    else:
        for change in changes:
            click.echo(transition_line(change, str(trace)))
    stalled = replay_document(changes)["first_stall_t"] is not None
    sys.exit(1 if stalled else 0)
