"""Fault scenarios several integration tests share, on real simulator processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from engine_watchdog.sim.launcher import SimProcess
from engine_watchdog.sim.loadgen import StreamingLoad


@asynccontextmanager
async def frozen_under_load(sim: SimProcess, sim_http: Any, watch: Any) -> AsyncIterator[None]:
    """Three streaming clients; once the watchdog saw progress, the engine loop freezes with
    requests in flight (``freeze-last``) and no new ones start; the body runs after the stall
    verdict. The fault is lifted on the way out, the load stopped."""
    async with StreamingLoad(sim.url, clients=3, max_tokens=200, model="sim-model") as load:
        await watch.next_state("progressing", timeout=20)
        await sim_http.set_fault(sim, "freeze-last")
        load.stop_new()
        await watch.next_state("stalled", timeout=40)
        try:
            yield
        finally:
            await sim_http.set_fault(sim, "none")
