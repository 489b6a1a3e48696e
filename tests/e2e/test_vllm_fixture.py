"""The real-vLLM fixture itself: it serves, its engine core is found, and a SIGSTOPped engine
core shows the seed's symptom (counters frozen, requests running, /health 200) and recovers
on SIGCONT. Everything else in tests/e2e builds on these facts."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from engine_watchdog.sim.loadgen import StreamingLoad
from tests.tools.vllm_server import (
    SERVED_MODEL,
    VllmServer,
    engine_core_stopped,
    http_get,
    metric_sum,
    scrape,
)

pytestmark = pytest.mark.e2e

GEN_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"


async def test_serves_completions_and_chat(vllm_server: VllmServer) -> None:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        body = {"model": SERVED_MODEL, "prompt": "Hello", "max_tokens": 20, "ignore_eos": True}
        async with session.post(f"{vllm_server.base_url}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            completion = await resp.json()
        assert completion["usage"]["completion_tokens"] == 20
        chat = {
            "model": SERVED_MODEL,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 5,
        }
        async with session.post(f"{vllm_server.base_url}/v1/chat/completions", json=chat) as resp:
            assert resp.status == 200, await resp.text()


def test_engine_core_is_found(vllm_server: VllmServer) -> None:
    assert len(vllm_server.engine_core_pids()) == 1


async def test_sigstop_freezes_tokens_while_health_stays_200(vllm_server: VllmServer) -> None:
    async with StreamingLoad(vllm_server.base_url, clients=4, max_tokens=400) as load:
        await load.wait_for(chunks=50, in_flight=2, timeout=60)
        async with engine_core_stopped(vllm_server):
            await asyncio.sleep(1.0)  # outputs already in the pipes drain first
            first, chunks = await scrape(vllm_server), load.chunks
            await asyncio.sleep(5.0)
            second = await scrape(vllm_server)
            health, _ = await asyncio.to_thread(http_get, f"{vllm_server.base_url}/health")
            in_flight = load.in_flight
        assert metric_sum(second, GEN_TOKENS) == metric_sum(first, GEN_TOKENS) > 0
        assert metric_sum(second, RUNNING) > 0
        assert health == 200
        assert load.chunks == chunks
        outcome = await load.stop(drain_s=60)
    assert outcome.hanging == 0, outcome
    assert outcome.errored == 0, outcome
    assert outcome.completed >= in_flight > 0
