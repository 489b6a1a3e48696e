"""The way out of a stall, simulator tier (tests/e2e/test_api_key.py has the real vLLM's): an idle
engine's core paused (SIGSTOP of the engine-core child only, the API process answering) made
the idle canary time out, the verdict ``stalled (wedged-idle)`` and the guard refuse. After
SIGCONT every request through the guard still got 503: nothing probed in that state (the guard
refused the requests that would prove progress, and the idle canary was not sent again).

Now the detector asks for a canary every --stalled-canary-interval while stalled, and the guard
admits again within one canary round after the engine answers."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest

from engine_watchdog.sim.launcher import SimProcess
from tests.tools.guard import admitted_within, completion, stream, watched

pytestmark = pytest.mark.timeout(180)
MODEL = "m"
CANARY_TIMEOUT_S = 3.0
STALLED_CANARY_S = 2.0
INTERVAL_S = 1.0
ROUND_S = STALLED_CANARY_S + CANARY_TIMEOUT_S + INTERVAL_S
"""One canary round: the wait before the next canary, the canary's own bound, a probe round."""


async def test_a_paused_idle_core_resumed_is_admitted_within_one_canary_round() -> None:
    args = (
        "--action", "answer", "--startup-grace", "0", "--interval", str(INTERVAL_S),
        "--canary-after", "1", "--idle-canary-interval", "2",
        "--canary-timeout", str(CANARY_TIMEOUT_S),
        "--stalled-canary-interval", str(STALLED_CANARY_S),
    )  # fmt: skip
    async with (
        SimProcess("--served-model-name", MODEL) as sim,
        watched(sim, *args) as guard,
        aiohttp.ClientSession() as s,
    ):
        await guard.wait_state("idle", 30)
        core = sim.engine_pids()[0]
        os.kill(core, signal.SIGSTOP)
        try:
            stalled = await guard.wait_state("stalled", 30)
            # The refusal follows the verdict by the answer rung's hold-back check (under a
            # second): a request sent in between is admitted and then answered with the error.
            refused = await stream(s, guard.guard_url, completion(MODEL, 2), timeout=10)
            if refused.status == 200 and refused.error is not None:
                refused = await stream(s, guard.guard_url, completion(MODEL, 2), timeout=10)
            # Past a few canary rounds while paused: each fails, the refusal holds.
            await asyncio.sleep(2 * ROUND_S)
            still = await stream(s, guard.guard_url, completion(MODEL, 2), timeout=10)
        finally:
            os.kill(core, signal.SIGCONT)
        resumed_t = time.time()
        took = await admitted_within(guard.guard_url, MODEL, 3 * ROUND_S, timeout=10)
        idle = await guard.wait_state("idle", 10, since=stalled["read_t"])
    assert stalled["cause"] in ("wedged-idle", "stopped", "no-progress"), stalled
    assert refused.status == 503 and still.status == 503, (refused.status, still.status)
    assert took is not None and took <= ROUND_S + 1.0, (took, guard.states())
    assert idle["read_t"] - resumed_t <= ROUND_S + 1.0, (idle, resumed_t)
