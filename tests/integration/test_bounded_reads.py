"""Every body is read to its end against a cap, never truncated and
never read without bound. Real aiohttp servers on loopback send the bodies in small chunks
with delays (as a busy engine's event loop does), with and without a Content-Length."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from engine_watchdog.probes.scrape import scrape
from tests.integration.conftest import StubFactory
from tests.tools.cli import run_cli
from tests.tools.stub_engine import Body, vllm_exposition
from tests.tools.watch import start_watch, stop_watch
from tests.waiting import eventually

MiB = 1 << 20
NO_HOST_PROBES = ("--no-gpu",)


@pytest.mark.parametrize("size", [30_000, 300_000, 2_000_000])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
async def test_a_body_sent_in_small_delayed_chunks_is_read_whole(
    stub_engine: StubFactory, size: int, chunked: bool
) -> None:
    body = vllm_exposition(filler_bytes=size, tokens=42.0)
    chunk = 8 * 1024  # a 30 KB body still comes in four pieces
    delay = min(0.005, 1.0 / (len(body) / chunk))  # about 1 s for the largest
    stub = await stub_engine(
        {"/metrics": lambda: Body(body, chunk=chunk, delay_s=delay, chunked=chunked)}
    )
    async with aiohttp.ClientSession() as session:
        raw = await scrape(session, stub.url + "/metrics", timeout_s=20.0, max_bytes=16 * MiB)
    assert raw.error is None, raw.detail
    assert raw.body is not None and len(raw.body) == len(body)
    last = 'vllm:iteration_tokens_total_count{engine="0",model_name="stub-model"} 42.0\n'
    assert raw.body.endswith(last)
    assert stub.cut_short == 0  # the server saw its whole answer read


async def test_eight_ranks_whose_counters_come_last_are_all_judged(
    stub_engine: StubFactory,
) -> None:
    """A data-parallel server's exposition (about 300 KB, counters last), sent in 32 KB chunks:
    every rank's counters are read, so each rank is judged progressing, through the CLI."""
    scrapes = 0

    def moving() -> Body:
        nonlocal scrapes
        scrapes += 1
        body = vllm_exposition(8, running=1.0, tokens=float(100 * scrapes), filler_bytes=300_000)
        return Body(body, chunk=32 * 1024, delay_s=0.003)

    stub = await stub_engine({"/metrics": moving})
    ran = await run_cli("check", stub.url, "--json", *NO_HOST_PROBES, "--timeout", "8")
    doc = ran.json()
    states = {e["engine"]: e["state"] for e in doc["engines"]}
    assert states == {str(r): "progressing" for r in range(8)}, ran.out + ran.err
    assert ran.code == 0
    assert stub.cut_short == 0


async def test_a_body_over_the_cap_is_a_clear_too_large_error(stub_engine: StubFactory) -> None:
    body = vllm_exposition(filler_bytes=2 * MiB)
    stub = await stub_engine({"/metrics": lambda: Body(body, chunk=32 * 1024, delay_s=0.001)})
    async with aiohttp.ClientSession() as session:
        raw = await scrape(session, stub.url + "/metrics", timeout_s=20.0, max_bytes=MiB)
    assert (raw.error, raw.body) == ("too-large", None)
    assert raw.detail is not None and "--max-scrape-bytes" in raw.detail
    ran = await run_cli(
        "check", stub.url, "--json", *NO_HOST_PROBES, "--max-scrape-bytes", str(MiB)
    )
    assert ran.code == 2, ran.out + ran.err  # unreachable, at once: waiting will not help
    doc = ran.json()
    assert doc["engines"][0]["cause"] == "too-large"
    assert "--max-scrape-bytes" in doc["error"], doc


async def test_an_endless_metrics_body_stops_at_the_cap(stub_engine: StubFactory) -> None:
    stub = await stub_engine({"/metrics": lambda: Body(endless=True)})
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        raw = await scrape(session, stub.url + "/metrics", timeout_s=20.0, max_bytes=MiB)
    assert raw.error == "too-large", raw
    assert time.monotonic() - started < 5.0  # stopped at the cap, not at the timeout


async def _peak_rss(pid: int, seconds: float) -> int:
    peak, deadline = 0, time.monotonic() + seconds
    proc = psutil.Process(pid)
    while time.monotonic() < deadline:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        await asyncio.sleep(0.05)
    return peak


def _records(trace: Path, kind: str) -> list[dict[str, Any]]:
    if not trace.exists():
        return []
    lines = trace.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


@pytest.mark.parametrize("endless", ["/health", "/v1/models", "/v1/completions"])
async def test_endless_bodies_keep_the_watchdog_small(
    stub_engine: StubFactory, tmp_path: Path, endless: str
) -> None:
    """An endless /health, /v1/models or completion body: the watchdog's memory stays bounded
    (it reached 286 MB when /health was read whole) and the probe reports too-large."""
    routes = {endless: lambda: Body(endless=True)}
    routes["/metrics"] = lambda: Body(vllm_exposition(running=1.0, tokens=5.0))  # flat: canary
    stub = await stub_engine(routes)
    trace = tmp_path / "trace.jsonl"
    watch = await start_watch(
        stub.url, *NO_HOST_PROBES, "--action", "none", "--record", str(trace),
        "--canary-after", "1", "--scrape-timeout", "4", "--canary-timeout", "4",
    )  # fmt: skip
    try:
        peak = await _peak_rss(watch.proc.pid, 7.0)
        kind = "health" if endless == "/health" else "canary"
        await eventually(lambda: _records(trace, kind), timeout=10, what=f"a {kind} record")
        assert watch.proc.returncode is None, "watch exited"
    finally:
        await stop_watch(watch)
    print(f"\n[bounded] endless {endless}: peak RSS {peak / MiB:.0f} MB")
    errors = {r.get("error") for r in _records(trace, kind)}
    wanted = "too-large" if kind == "health" else f"unusable: {endless}: too-large"
    if endless == "/v1/completions":
        wanted = "unusable: completion: too-large"
    assert wanted in errors, errors
    assert peak < 150 * MiB, f"peak RSS {peak / MiB:.0f} MB"
