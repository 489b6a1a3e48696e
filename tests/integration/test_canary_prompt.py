"""A canary's answer is judged when it comes, not at the next probe round (on a real vLLM the
failed canary waited up to a round, which put the verdict at 13-15 s, at the edge of the 15 s it
must meet). A stand-in engine (a real aiohttp server on loopback) shows work
and no progress and never answers the completion; with 5 s rounds the difference is plain."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.integration.conftest import StubFactory
from tests.tools.stub_engine import Body, vllm_exposition
from tests.tools.watch import start_watch, stop_watch


async def test_a_failed_canary_is_judged_at_once(stub_engine: StubFactory, tmp_path: Path) -> None:
    engine = await stub_engine(
        {
            "/metrics": lambda: Body(vllm_exposition(running=1.0, tokens=9.0)),
            "/v1/completions": lambda: Body(hang=True),
        }
    )
    trace = tmp_path / "trace.jsonl"
    watch = await start_watch(
        engine.url, "--no-gpu", "--action", "none", "--record", str(trace), "--interval", "5",
        "--stall-seconds", "60", "--startup-grace", "0", "--canary-after", "1",
        "--canary-timeout", "2", "--fast-stall-seconds", "3",
    )  # fmt: skip
    try:
        await watch.next_state("stalled", timeout=30)
        said_at = time.time()  # when the watchdog said it (the verdict's own t is the data's)
    finally:
        await stop_watch(watch)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    (canary,) = [r for r in records if r["kind"] == "canary"]
    assert canary["error"] == "timeout"
    assert said_at - canary["t"] < 1.0, said_at - canary["t"]  # was up to a round: 5 s
