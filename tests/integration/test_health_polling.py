"""/health is polled only where it answers without waiting on the engine.

TGI's /health asks every shard over gRPC with no timeout, so it hangs with a hung shard; SGLang's
runs a generation. Polled each round, such a /health would hold every probe round for the scrape
timeout. A real aiohttp server on loopback stands in for the engine: its /health never answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from engine_watchdog.core.settings import ProbeSettings, WatchSettings
from engine_watchdog.runtime.watch.watcher import watcher_for
from engine_watchdog.sim.launcher import free_port
from tests.tools.cli import run_cli

BODIES = {
    "tgi": "# TYPE tgi_queue_size gauge\ntgi_queue_size 1\ntgi_batch_current_size 1\n"
    'tgi_batch_inference_count{method="decode"} 7\n',
    "sglang": 'sglang:num_running_reqs{tp_rank="0"} 1\nsglang:num_queue_reqs{tp_rank="0"} 0\n'
    'sglang:cuda_graph_passes_total{tp_rank="0",mode="decode_none"} 9\n',
    "vllm": 'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_waiting{engine="0"} 0\n'
    'vllm:generation_tokens_total{engine="0"} 5\n',
}


TIMEOUT_S = 2.0


@dataclass
class Engine:
    url: str
    health_hits: int = 0


@pytest.fixture
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    body = BODIES[request.param]
    eng = Engine("")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=body)

    async def health(_: web.Request) -> web.Response:
        eng.health_hits += 1
        await asyncio.sleep(30)  # a hung shard: the router waits on it
        return web.Response(text="")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/health", health)])
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    eng.url = f"http://127.0.0.1:{port}"
    try:
        yield eng
    finally:
        await runner.cleanup()


async def three_rounds(url: str) -> float:
    probe = ProbeSettings(canary=False, gpu=False, procs=False, scrape_timeout_s=TIMEOUT_S)
    settings = WatchSettings(url=url, engine="auto", probe=probe)
    async with aiohttp.ClientSession() as session:
        watcher = watcher_for(settings, session)
        started = time.monotonic()
        try:
            for _ in range(3):
                await watcher.tick()
        finally:
            watcher.close()
    return time.monotonic() - started


@pytest.mark.parametrize("engine", ["tgi", "sglang"], indirect=True)
async def test_health_that_waits_on_the_engine_is_not_polled(engine: Engine) -> None:
    took = await three_rounds(engine.url)
    # The first round detects the engine (and may ask /health once); later rounds do not.
    assert engine.health_hits <= 1
    assert took < TIMEOUT_S * 2 + 2.0, f"rounds held by /health: {took:.1f} s"


@pytest.mark.parametrize("engine", ["vllm"], indirect=True)
async def test_vllm_health_is_polled_every_round(engine: Engine) -> None:
    await three_rounds(engine.url)
    assert engine.health_hits == 3  # vLLM's /health answers from the API server: a cheap probe


@dataclass
class Answering:
    """A vLLM-shaped server whose /metrics and /health say what the test sets."""

    url: str = ""
    metrics_status: int = 200
    health_status: int = 200
    health_hits: int = 0


@pytest.fixture
async def answering() -> AsyncIterator[Answering]:
    eng = Answering()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=BODIES["vllm"], status=eng.metrics_status)

    async def health(_: web.Request) -> web.Response:
        eng.health_hits += 1
        return web.Response(text="", status=eng.health_status)

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/health", health)])
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    eng.url = f"http://127.0.0.1:{port}"
    try:
        yield eng
    finally:
        await runner.cleanup()


async def test_check_asks_health_once_while_the_metrics_answer(answering: Answering) -> None:
    """A one-shot check sends half the requests of a fleet sweep: /health in the first round
    (a dead engine's 503 is seen at once) and again only when /metrics stops answering."""
    quick = ("--no-canary", "--stall-seconds", "2", "--startup-grace", "0")
    ran = await run_cli("check", answering.url, *quick)
    assert ran.code == 1 and "no-progress" in ran.out  # flat with a request running
    assert answering.health_hits == 1, answering.health_hits
    answering.health_status, answering.health_hits = 503, 0
    dead = await run_cli("check", answering.url, *quick)
    assert dead.code == 1 and "engine-dead" in dead.out, dead.out
    answering.metrics_status, answering.health_status, answering.health_hits = 500, 200, 0
    down = await run_cli("check", answering.url, "--no-canary", "--timeout", "3")
    assert down.code == 2 and answering.health_hits >= 2, (down.out, answering.health_hits)
