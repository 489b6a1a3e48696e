"""``record`` and ``replay`` commands.

Exit status of replay: 0 no stall, 1 stalled, 65 nothing in the trace was usable, 66 the trace
cannot be read. record: 0 done, 73 the trace cannot be written.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click

from engine_watchdog.cli.exits import EXIT_CANTCREAT, EXIT_DATAERR, EXIT_NOINPUT, CliError
from engine_watchdog.cli.numbers import POSITIVE
from engine_watchdog.cli.options import DETECTOR, ENGINE, JSON, PROBE
from engine_watchdog.core.checks import fold_thresholds, validate
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
@click.option(
    "--duration", type=POSITIVE, default=60.0, show_default=True, help="Seconds to record."
)
def record(url: str, output: Path, duration: float, **kw: Any) -> None:
    """Record observations of an engine into a replayable trace."""
    from engine_watchdog.cli.options import watch_settings
    from engine_watchdog.runtime.assembly import ConsoleReporter
    from engine_watchdog.runtime.runner import probe_loop
    from engine_watchdog.runtime.trace.recording import RoundRecords, TraceWriter
    from engine_watchdog.runtime.watch.watcher import watcher_for

    settings = validate(watch_settings(kw, url))
    rounds = max(1, round(duration / settings.probe.interval_s))

    async def go() -> None:
        import aiohttp

        writer = TraceWriter(output, "--output")
        try:
            async with aiohttp.ClientSession() as session:
                watcher = watcher_for(settings, session, records=RoundRecords((writer.write,)))
                await probe_loop(watcher, [ConsoleReporter(False, click.echo)], rounds)
        finally:
            writer.close()
        if writer.error is not None:
            why = f"{writer.error.strerror}: free space there, or record elsewhere"
            raise CliError(f"--output {output}: the trace is incomplete ({why})", EXIT_CANTCREAT)

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
    from engine_watchdog.runtime.trace.replay import judge, replay_document

    as_json = JSON.take(kw)
    given = DETECTOR.overrides(kw)
    profile = PROFILES[engine] if engine else VLLM
    counted = [0]
    try:
        with trace.open(encoding="utf-8", errors="replace") as lines:
            judged = judge(
                _counting(lines, counted),
                profile,
                lambda s: fold_thresholds(given(s)),
                follow_engine=engine is None,
            )
    except OSError as exc:
        raise CliError(f"{trace}: cannot read it ({exc.strerror})", EXIT_NOINPUT) from None
    if not judged.records:
        raise CliError(_unusable(trace, counted[0]), EXIT_DATAERR)
    changes, stuck = judged.changes, judged.stuck
    if as_json:
        click.echo(json.dumps(replay_document(changes, stuck)))
    else:
        for change in changes:
            click.echo(transition_line(change, str(trace)))
        for s in stuck:
            click.echo(f"{s.t:.3f} request {s.request_id} stuck: {s.evidence}")
    stalled = replay_document(changes)["first_stall_t"] is not None
    sys.exit(1 if stalled else 0)


def _counting(lines: Iterable[str], counted: list[int]) -> Iterator[str]:
    for line in lines:
        counted[0] += 1
        yield line


def _unusable(trace: Path, lines: int) -> str:
    what = "the file is empty" if lines == 0 else f"{lines} line(s), none usable: see above"
    return (
        f"{trace}: no usable record ({what}): replay a JSON Lines trace written by "
        "`watch --record` or `record` (docs/traces.md)"
    )
