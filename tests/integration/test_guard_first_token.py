"""A request before its first token is evidence (docs/guard.md, "Before the first token"): an
engine that froze while idle counts nothing, so the requests the guard holds are what shows it.
``watch --guard-listen`` with the default settings, on the simulator, through the console
script: every client answered within 15 s of sending, streaming or not; a long prefill on an
idle engine left alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine_watchdog.sim.launcher import SimProcess
from tests.tools.guard import (
    GuardProcess,
    Log,
    admitted_within,
    completion,
    post_json,
    start_guard,
    stop_guard,
    stream,
)
from tests.tools.watch import metric
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(150)
MODEL = "m"
ANSWERED_S = 15.0
"""The promise: a client of an engine that froze while idle is answered within this."""


@asynccontextmanager
async def idle_watched(sim: SimProcess, incidents: Path) -> AsyncIterator[GuardProcess]:
    """``watch --guard-listen`` with the defaults, once the engine is idle and its first idle
    canary answered: from then on the idle canary comes once a minute."""
    guard = await start_guard("watch", sim.url, "--incident-dir", str(incidents), log=True)
    try:
        await guard.wait_state("idle", 30)
        await eventually(lambda: _canaries_seen(guard), 30, 0.2, "an idle canary")
        yield guard
    finally:
        await stop_guard(guard)


async def _canaries_seen(guard: GuardProcess) -> float | None:
    text = await guard.metrics()
    return metric(text, "engine_watchdog_last_observation_timestamp_seconds", probe="canary")


async def _send(s: aiohttp.ClientSession, url: str, kind: str) -> tuple[str, float, int, bytes]:
    """One request of ``kind`` (stream, plain, chat): (kind, seconds to its end, status, body)."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "stream": kind != "plain"}
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    body |= chat if kind == "chat" else {"prompt": "hi"}
    started = time.monotonic()
    async with s.post(url + path, json=body, timeout=aiohttp.ClientTimeout(90)) as r:
        data = await r.read()
    return kind, time.monotonic() - started, r.status, data


async def _answered(guard: GuardProcess) -> list[tuple[str, float, int, bytes]]:
    async with aiohttp.ClientSession() as s:
        kinds = ("stream", "plain", "chat")
        return await asyncio.gather(*(_send(s, guard.guard_url, k) for k in kinds))


def _check(got: list[tuple[str, float, int, bytes]], states: list[str], cause: str) -> None:
    for kind, seconds, status, body in got:
        assert seconds <= ANSWERED_S, (kind, seconds, states)
        assert b"ServiceUnavailableError" in body, (kind, status, body[-300:])
        assert status == (503 if kind == "plain" else 200), (kind, status)
    assert f"stalled({cause})" in states, states


async def test_clients_of_an_engine_that_froze_while_idle_are_answered_within_15_s(
    tmp_path: Path,
) -> None:
    """Before: 67.7 s (stopped) and 68.5 s (deadlocked) each: the idle canary's minute, then
    its 8 s timeout, /status idle meanwhile. A stopped core shows in the process table (2.0 s);
    a deadlocked one only to the canary, sent at once (12.3 s: the last request's progress,
    seen after this one came, and 1.5 s quiet; a round; the canary's 8 s; the answer)."""
    async with (
        SimProcess("--served-model-name", MODEL) as sim,
        idle_watched(sim, tmp_path) as guard,
    ):
        log = Log(guard)
        core = sim.engine_pids()[0]
        os.kill(core, signal.SIGSTOP)
        try:
            await asyncio.sleep(2)  # frozen a while before the requests come
            stopped = await _answered(guard)
            stopped_states = guard.states()
        finally:
            os.kill(core, signal.SIGCONT)
        # The way out: the canary every few seconds while stalled finds it back.
        back = await admitted_within(guard.guard_url, MODEL, 30, timeout=10)
        said = await eventually(lambda: log.once("passing requests again"), 10, 0.2, "passing")
        await post_json(sim.url + "/sim/fault", {"fault": "deadlock"})  # the next step blocks
        seen = len(guard.lines)
        try:
            deadlocked = await _answered(guard)
            deadlocked_states = guard.states()[seen:]
        finally:
            await post_json(sim.url + "/sim/fault", {"fault": "none"})
    for name, got in (("stopped", stopped), ("deadlocked", deadlocked)):
        print(f"\n[guard] idle engine {name}: " + ", ".join(f"{k} {t:.1f} s" for k, t, *_ in got))
    _check(stopped, stopped_states, "stopped")
    assert back is not None, guard.states()
    # The refusal is a warning, its all-clear is not (it was logged at WARNING too).
    levels = {json.loads(x)["msg"][:29]: json.loads(x)["level"] for x in said.splitlines()}
    assert levels["guard: refusing new requests:"] == "warning", levels
    assert levels["guard: passing requests again"] == "info", levels
    _check(deadlocked, deadlocked_states, "wedged-idle")


async def test_a_long_prefill_on_an_idle_engine_is_not_a_stall(tmp_path: Path) -> None:
    """The only request, 20 s before its first token (longer than the 15 s promise and two
    canary timeouts) while the engine works and the canary answers: no stall, no error."""
    async with (
        SimProcess("--served-model-name", MODEL) as sim,
        idle_watched(sim, tmp_path) as guard,
        aiohttp.ClientSession() as s,
    ):
        fault = {"fault": "long-prefill", "long_prefill_seconds": 20}
        await post_json(sim.url + "/sim/fault", fault)
        started = time.time()
        got = await stream(s, guard.guard_url, completion(MODEL, 5), timeout=90)
        canary_t = await _canaries_seen(guard)
    assert got.error is None and got.done and got.tokens == 5, got.events[-2:]
    assert got.times[0] - started >= 19.0, got.times[0] - started
    assert "stalled" not in {d["state"] for d in guard.lines}, guard.states()
    assert canary_t is not None and canary_t > started, "no canary while the request waited"
