"""``record`` and ``replay`` commands."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from engine_watchdog.cli.options import DETECTOR, ENGINE, JSON, PROBE
from engine_watchdog.core.settings import fold_thresholds, validate
from engine_watchdog.engines import PROFILES, VLLM


@click.command()
@click.argument("url")
@ENGINE
@PROBE
@DETECTOR
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Trace file to append to (JSON Lines).",
)
@click.option("--duration", type=float, default=60.0, show_default=True, help="Seconds to record.")
def record(url: str, output: Path, duration: float, **kw: Any) -> None:
    """Record observations of an engine into a replayable trace."""
    from engine_watchdog.cli.options import watch_settings
    from engine_watchdog.runtime.assembly import ConsoleReporter
    from engine_watchdog.runtime.runner import probe_loop
    from engine_watchdog.runtime.trace import TraceWriter
    from engine_watchdog.runtime.watcher import Watcher

    settings = validate(watch_settings(kw, url))
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
@click.option(
    "--engine",
    type=click.Choice(sorted(PROFILES)),
    default=None,
    help="Parse the scrapes as this engine's [default: the engine the trace names, else vllm].",
)
@DETECTOR.options(with_defaults=False)
@JSON
def replay(trace: Path, engine: str | None, **kw: Any) -> None:
    """Run the detector over a recorded trace and print the verdict transitions.

    The detector judges with the settings the trace was recorded with; the options given here
    override them.
    """
    from engine_watchdog.report.console import transition_line
    from engine_watchdog.runtime.replay import replay_all, replay_document

    as_json = JSON.take(kw)
    given = DETECTOR.overrides(kw)
    profile = PROFILES[engine] if engine else VLLM
    with trace.open(encoding="utf-8", errors="replace") as lines:
        changes, stuck = replay_all(
            lines, profile, lambda s: fold_thresholds(given(s)), follow_engine=engine is None
        )
    if as_json:
        click.echo(json.dumps(replay_document(changes, stuck)))
    else:
        for change in changes:
            click.echo(transition_line(change, str(trace)))
        for s in stuck:
            click.echo(f"{s.t:.3f} request {s.request_id} stuck: {s.evidence}")
    stalled = replay_document(changes)["first_stall_t"] is not None
    sys.exit(1 if stalled else 0)
