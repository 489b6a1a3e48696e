"""The guard in front of a REAL vLLM (CPU), in supervise mode (issue 15, "Proof"):
``engine-watchdog run --guard-listen ... -- <vLLM>`` with the ladder answer -> capture ->
restart, vLLM loading the stuck-request test plugin (tests/e2e/plugin: a request whose id holds
``stuck`` stops being scheduled after two tokens). ONE supervised engine serves the module; the
tests run in file order:

a. healthy streaming load for two minutes through the guard: no request aborted, and every
   response identical event for event to the same request sent straight to the engine at the
   same moment (temperature 0, a fixed seed; the pair shares the batch);
b. one request stuck while others progress: only that client gets the error; the others
   complete; the engine's own metrics show the request gone from the running batch;
c. SIGSTOP of the engine core under load: every client in flight gets the error within the
   stall verdict + 1 s, new requests get 503 within 1 s, and after the restart requests pass.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator

import aiohttp
import pytest

from engine_watchdog.sim.launcher import free_port
from engine_watchdog.sim.loadgen import StreamingLoad
from tests.tools.guard import Stream, completion, stream
from tests.tools.recovery_harness import (
    REPORT_LINES,
    Supervised,
    WatchdogOptions,
    start_supervised,
    stop_supervised,
)
from tests.tools.vllm_env import VllmEnv
from tests.tools.vllm_server import SERVED_MODEL, STUCK_MARKER_ENV, http_get, metric_sum
from tests.tools.watch import metric

pytestmark = pytest.mark.e2e

GUARD_PORT = free_port()
GUARD = f"http://127.0.0.1:{GUARD_PORT}"
STUCK_S = 5.0
HEALTHY_S = 120.0
OPTS = WatchdogOptions(
    actions="answer,capture,restart",
    extra=("--guard-listen", f"127.0.0.1:{GUARD_PORT}", "--request-stall-seconds", str(STUCK_S)),
    engine_env=((STUCK_MARKER_ENV, "stuck"),),
)


@pytest.fixture(scope="module")
def supervised(vllm_env: VllmEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    sup = start_supervised(vllm_env, tmp_path_factory.mktemp("guard"), OPTS)
    try:
        yield sup
    finally:
        stop_supervised(sup)


def normalised(events: list[bytes]) -> list[bytes]:
    out = []
    for e in events:
        e = re.sub(rb'"created":\d+', b'"created":0', e)
        out.append(re.sub(rb'"id":"cmpl-[^"]*"', b'"id":"-"', e))
    return out


async def watchdog_metric(sup: Supervised, name: str, **labels: str) -> float:
    argv = [str(a) for a in sup.proc.args]  # type: ignore[union-attr]
    listen = argv[argv.index("--listen") + 1]
    _, text = await asyncio.to_thread(http_get, f"http://{listen}/metrics")
    return metric(text, name, **labels) or 0.0


@pytest.mark.timeout(600)  # also starts the module's engine
async def test_healthy_load_through_the_guard_is_identical_and_never_aborted(
    supervised: Supervised,
) -> None:
    sup = supervised
    pairs: list[tuple[Stream, Stream]] = []
    deadline = time.monotonic() + HEALTHY_S

    async def pair_client(i: int, session: aiohttp.ClientSession) -> None:
        n = 0
        while time.monotonic() < deadline:
            body = completion(SERVED_MODEL, 48 + 16 * i, seed=1234 + n)
            direct, through = await asyncio.gather(
                stream(session, sup.base_url, body, f"direct-{i}-{n}"),
                stream(session, GUARD, body, f"guard-{i}-{n}"),
            )
            pairs.append((direct, through))
            n += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(pair_client(i, session) for i in range(3)))
    different = [
        (d.request_id, normalised(d.events)[:3], normalised(g.events)[:3])
        for d, g in pairs
        if normalised(d.events) != normalised(g.events)
    ]
    REPORT_LINES.append(
        f"guard healthy {HEALTHY_S:.0f} s: {len(pairs)} pairs, {len(different)} differ"
    )
    assert pairs and all(g.done and g.error is None for _, g in pairs)
    assert different == [], different[:3]
    assert await watchdog_metric(sup, "engine_watchdog_guard_stuck_requests_total") == 0
    assert (
        await watchdog_metric(sup, "engine_watchdog_guard_aborted_requests_total", reason="stall")
        == 0
    )
    assert [v for v in sup.transitions if v["state"] == "stalled"] == []


async def test_only_the_stuck_request_is_answered_and_the_engine_drops_it(
    supervised: Supervised,
) -> None:
    """Three clients stream continuously (so the others always move) while one request is kept
    from being scheduled after two tokens."""
    sup = supervised
    async with (
        aiohttp.ClientSession() as session,
        StreamingLoad(GUARD, clients=3, max_tokens=300, model=SERVED_MODEL) as load,
    ):
        await load.wait_for(chunks=20, in_flight=3, timeout=60)
        body = completion(SERVED_MODEL, 1500)
        stuck = await stream(session, GUARD, body, "stuck-1", timeout=90)
        await asyncio.sleep(1.0)
        text = (await asyncio.to_thread(http_get, sup.base_url + "/metrics"))[1]
        running, in_flight = metric_sum(text, "vllm:num_requests_running"), load.in_flight
        outcome = await load.stop(drain_s=60)
    context = f"{stuck.events[-3:]}\n{sup.log_tail(40)}"
    assert stuck.error is not None and stuck.done, context
    assert stuck.error["code"] == 503, context
    assert stuck.tokens == 2, context  # the plugin let it have two
    assert (outcome.errored, outcome.hanging) == (0, 0), outcome.errors
    assert running <= in_flight, (running, in_flight)  # the stuck request left the batch
    assert (
        await watchdog_metric(sup, "engine_watchdog_guard_aborted_requests_total", reason="stuck")
        == 1
    )
    assert [v for v in sup.transitions if v["state"] == "stalled"] == []


async def test_a_stopped_engine_core_s_clients_are_answered_and_requests_pass_after_restart(
    supervised: Supervised,
) -> None:
    """The engine core stays stopped: the watchdog restarts the engine (the harness SIGCONTs
    and ends whatever is left when the module ends)."""
    sup = supervised
    async with aiohttp.ClientSession() as session:
        clients = [
            asyncio.create_task(stream(session, GUARD, completion(SERVED_MODEL, 1800), f"c-{i}"))
            for i in range(4)
        ]
        await asyncio.sleep(3.0)
        fault_t = time.time()
        for pid in sup.engine_core_pids():
            os.kill(pid, signal.SIGSTOP)
        answered = await asyncio.wait_for(asyncio.gather(*clients), 60)
        refused_t = time.time()
        refused = await stream(session, GUARD, completion(SERVED_MODEL, 4))
        verdict = next(v for v in sup.verdicts(fault_t) if v["state"] == "stalled")
        during, after = [], refused
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and after.status != 200:
            await asyncio.sleep(1.0)
            after = await stream(session, GUARD, completion(SERVED_MODEL, 4))
            during.append(after.status)
    last_token = max(t for c in answered for t in c.times[:-2])
    late = max(c.times[-1] for c in answered) - verdict["t"]
    line = (
        f"guard SIGSTOP: verdict {verdict['t'] - last_token:.1f} s after the last event "
        f"({verdict['cause']}), clients answered by +{late:.2f} s, "
        f"serving again {time.time() - fault_t:.0f} s after the fault"
    )
    REPORT_LINES.append(line)
    print(f"\n[e2e] {line}")
    assert verdict["cause"] == "stopped", verdict
    assert verdict["t"] - last_token <= 7.0, line
    for c in answered:
        assert c.error is not None and c.done, c.events[-2:]
        assert c.times[-1] <= verdict["t"] + 1.0, line
    assert refused.status == 503 and "Retry-After" in refused.headers
    assert refused_t - verdict["t"] <= 1.0  # sent as soon as the clients were answered
    restarts = [a for a in sup.actions(fault_t) if a["action"] == "restart"]
    assert [a["result"] for a in restarts] == ["ok"], sup.actions(fault_t)
    assert set(during[:-1]) <= {503}, during  # refused, never hanging, until it is back
    assert after.status == 200 and after.done and after.error is None, after
