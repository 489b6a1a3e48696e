"""Kubernetes Events for incidents. No cluster runs here: the API server is a loopback stand-in
that accepts what a real one does for `POST /api/v1/namespaces/NS/events` (what kubectl proxy
would forward); the watchdog, the simulator and the stall are real."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from aiohttp import web

from engine_watchdog.sim.launcher import free_port
from tests.integration.conftest import SimFactory, SimHttp
from tests.waiting import eventually


async def fake_api() -> tuple[web.AppRunner, str, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []

    async def create(request: web.Request) -> web.Response:
        assert request.match_info["ns"] == "llm"
        events.append(await request.json())
        return web.json_response({"kind": "Event"}, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/events", create)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}", events


async def test_a_stall_and_its_capture_become_events_on_the_pod(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Any
) -> None:
    runner, api, events = await fake_api()
    sim = await sim_factory("--tokens-per-second", "30")
    env = {**os.environ, "POD_NAME": "vllm-0", "POD_NAMESPACE": "llm", "POD_UID": "u-1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine_watchdog", "watch", sim.url, "--listen", "",
        "--k8s-events", api, "--idle-canary-interval", "2", "--canary-after", "1",
        "--action", "capture", "--incident-dir", str(tmp_path),
        env=env, stdout=asyncio.subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        await sim_http.set_fault(sim, "deadlock")  # fires on the idle canary's step
        await eventually(lambda: len(events) >= 2, timeout=60, what="two events")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        await proc.wait()
        await runner.cleanup()
    reasons = [e["reason"] for e in events]
    assert reasons[:2] == ["EngineStalled", "EngineWatchdogCapture"]
    assert events[0]["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": "llm",
        "name": "vllm-0",
        "uid": "u-1",
    }
    assert "wedged-idle" in events[0]["message"] and events[0]["type"] == "Warning"
    assert "bundle" in events[1]["message"]
