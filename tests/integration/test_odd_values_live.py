"""Odd metric values, live: stand-in engines (real aiohttp servers on loopback) whose /metrics
hold odd values, watched through the installed console script. Each of them hangs (nothing
moves while requests run); the watchdog must say stalled, and say each odd thing once in its
log. It said nothing, and two of them (counters flapping between two replicas, a counter
reading -1 every other scrape) read as a restart on every scrape and were never stalled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from itertools import count
from pathlib import Path

from tests.integration.conftest import StubFactory
from tests.tools.cli import run_cli
from tests.tools.stub_engine import Body, bad_input
from tests.tools.watch import start_watch, stop_watch

FAST = ("--stall-seconds", "6", "--suspect-seconds", "2", "--startup-grace", "0", "--no-gpu")


def alternating(*names: str) -> Body:
    """Each request gets the next file of ``names``, round and round."""
    turn = count()

    def route() -> Body:
        return Body(bad_input(names[next(turn) % len(names)]))

    return route  # type: ignore[return-value]


async def test_odd_expositions_of_hung_engines_are_stalled_and_said_once(
    stub_engine: StubFactory, tmp_path: Path
) -> None:
    engines = {
        "flapping": await stub_engine(
            {
                "/metrics": alternating(
                    "metrics_flapping_replica_a.txt", "metrics_flapping_replica_b.txt"
                )
            }
        ),
        "negative": await stub_engine(
            {
                "/metrics": alternating(
                    "metrics_duplicate_series.txt", "metrics_negative_counter.txt"
                )
            }
        ),
        "duplicates": await stub_engine(
            {"/metrics": lambda: Body(bad_input("metrics_duplicate_series.txt"))}
        ),
    }
    log = tmp_path / "watch.log"
    urls = {e.url: name for name, e in engines.items()}
    watch = await start_watch(*urls, "--no-canary", "--action", "none", *FAST, stderr=log)
    stalled: dict[str, float] = {}
    deadline = time.monotonic() + 25.0
    try:
        assert watch.proc.stdout is not None
        while len(stalled) < len(engines) and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                line = await asyncio.wait_for(watch.proc.stdout.readline(), 1.0)
                assert line, f"watch exited: {log.read_text()}"
                doc = json.loads(line)
                if doc["state"] == "stalled":
                    stalled.setdefault(urls[doc["target"]], doc["seconds_without_progress"])
        await asyncio.sleep(2.0)  # more rounds: the notes must not repeat
    finally:
        await stop_watch(watch)
    assert set(stalled) == set(engines), f"stalled in 25 s: {stalled}"
    said = {name: _lines_of(log, e.url) for name, e in engines.items()}
    assert said["flapping"].count("counters went back and forth") == 1, said
    assert said["negative"].count("reads -1.0: no counter can") == 1, said
    assert said["duplicates"].count("appear more than once in /metrics") == 1, said


def _lines_of(log: Path, url: str) -> str:
    return "\n".join(line for line in log.read_text().splitlines() if f"{url}:" in line)


async def test_nan_work_gauges_do_not_make_a_hung_engine_look_idle(
    stub_engine: StubFactory,
) -> None:
    """running and waiting NaN, counters frozen, the canary never answered: stalled by the
    canary (it was: idle, exit 0)."""
    engine = await stub_engine(
        {
            "/metrics": lambda: Body(bad_input("metrics_nan_running.txt")),
            "/v1/completions": lambda: Body(hang=True),
        }
    )
    ran = await run_cli(
        "check", engine.url, "--json", "--no-gpu", "--startup-grace", "0",
        "--canary-after", "1", "--canary-timeout", "2", "--fast-stall-seconds", "4",
        "--timeout", "15",
    )  # fmt: skip
    doc = ran.json()
    assert (ran.code, doc["state"]) == (1, "stalled"), ran.out + ran.err
    assert "unknown, not zero" in ran.err
