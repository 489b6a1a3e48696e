"""`watch` as a real process against a real simulator: transitions, own endpoints, traces."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from engine_watchdog.sim.loadgen import StreamingLoad
from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.cli import run_cli
from tests.tools.watch import get, metric
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]


async def test_watch_reports_the_freeze_serves_its_endpoints_and_records_a_trace(
    sim_factory: SimFactory, sim_http: SimHttp, watch_factory: Any, tmp_path: Path
) -> None:
    sim = await sim_factory("--tokens-per-second", "30")
    trace = tmp_path / "trace.jsonl"
    watch = await watch_factory(
        sim.url, "--stall-seconds", "10", "--record", str(trace), "--action", "none"
    )
    await watch.next_state("idle", timeout=20)
    assert (await get(watch.base + "/readyz"))[0] == 200
    async with StreamingLoad(sim.url, clients=4, max_tokens=60, model="sim-model") as load:
        await watch.next_state("progressing", timeout=20)
        await sim_http.set_fault(sim, "freeze-last")
        load.stop_new()
        stalled = await watch.next_state("stalled", timeout=40)
        assert stalled["engine"] == "0" and stalled["cause"] in ("no-progress", "host-deadlock")
        _, text = await get(watch.base + "/metrics")
        assert metric(text, "engine_watchdog_stalled", engine="0") == 1.0
        assert metric(text, "engine_watchdog_stall_verdicts_total", cause=stalled["cause"]) == 1.0
        assert (await get(watch.base + "/livez"))[0] == 200  # --action none: never 503
        _, doc = await get(watch.base + "/status")
        assert json.loads(doc)["engines"][0]["state"] == "stalled"
    watch.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(watch.proc.wait(), 15) == -signal.SIGTERM  # (orderly)
    replay = await run_cli("replay", str(trace), "--json", "--stall-seconds", "10")
    assert replay.code == 1
    assert replay.json()["first_stall_cause"] == stalled["cause"]
    assert (
        abs(replay.json()["first_stall_t"] - stalled["t"]) < 1e-6
    )  # the same verdict, bit for bit
    # The API server runs as `<this venv>/bin/python -m engine_watchdog.sim`: the trace keeps
    # its title without the directories, which name this machine (runtime/trace/recording.py).
    titles = [
        p["title"]
        for line in trace.read_text().splitlines()
        if (rec := json.loads(line)).get("kind") == "procs"
        for p in rec["procs"]
    ]
    server = f"<dir>/{Path(sys.executable).name} -m engine_watchdog.sim"
    assert any(t.startswith(server) for t in titles), titles[:3]
    assert not [t for t in titles if str(REPO) in t or str(Path(sys.executable).parent) in t]


async def test_watch_says_engine_dead_when_the_engine_core_crashes(
    sim_factory: SimFactory, sim_http: SimHttp, watch_factory: Any
) -> None:
    sim = await sim_factory("--tokens-per-second", "30")
    watch = await watch_factory(sim.url, "--action", "none")
    await watch.next_state("idle", timeout=20)
    await sim_http.set_fault(sim, "crash")
    # The idle canary may be in flight and fail first (HTTP 500): engine-dead must follow.
    await watch.next_state("stalled", timeout=20, cause="engine-dead")
    await eventually(lambda: sim.returncode is not None, timeout=20, what="the API server exits")


async def test_a_restart_by_the_watchdog_is_starting_not_a_second_incident(
    sim_factory: SimFactory, sim_http: SimHttp, watch_factory: Any
) -> None:
    """watch kills the stuck engine core; the API server answers its last values with /health
    503 for a moment, exits, and its supervisor (here: the test, on the same port) starts a new
    one. Between the two the verdict is starting (restarting), never engine-dead."""
    sim = await sim_factory("--tokens-per-second", "30")
    watch = await watch_factory(sim.url, "--action", "restart", "--stall-seconds", "8")
    await watch.next_state("idle", timeout=20)
    async with StreamingLoad(sim.url, clients=3, max_tokens=60, model="sim-model") as load:
        await load.wait_for(chunks=30, in_flight=2, timeout=30)
        await sim_http.set_fault(sim, "freeze-last")
        load.stop_new()
        await watch.next_state("stalled", timeout=40)
        restarting = await watch.next_state("starting", timeout=30)
        assert restarting["cause"] == "restarting"
        await eventually(lambda: sim.returncode is not None, timeout=20, what="the API exits")
    await sim_factory("--tokens-per-second", "30", port=sim.port)  # the kubelet's part
    await watch.next_state("idle", timeout=30)
    after = watch.lines[watch.lines.index(restarting) :]
    assert [d for d in after if d["state"] in ("stalled", "unreachable")] == [], after
    _, text = await get(watch.base + "/metrics")
    assert metric(text, "engine_watchdog_stall_verdicts_total", cause="engine-dead") in (None, 0.0)


async def test_liveness_rung_fails_livez_until_the_engine_progresses_again(
    sim_factory: SimFactory, sim_http: SimHttp, watch_factory: Any
) -> None:
    """For an engine livenessProbe pointed at the watchdog: 503 once the policy says the engine
    must go, 200 again once it serves (docs/recovery.md has the trade-off)."""
    sim = await sim_factory("--tokens-per-second", "30")
    watch = await watch_factory(sim.url, "--action", "liveness", "--stall-seconds", "8")
    await watch.next_state("idle", timeout=20)
    assert (await get(watch.base + "/livez"))[0] == 200
    async with StreamingLoad(sim.url, clients=3, max_tokens=60, model="sim-model") as load:
        await load.wait_for(chunks=30, in_flight=2, timeout=30)
        await sim_http.set_fault(sim, "freeze-last")
        load.stop_new()
        await watch.next_state("stalled", timeout=40)
        await eventually(lambda: _status(watch.base + "/livez", 503), timeout=15, what="/livez 503")
        await sim_http.set_fault(sim, "none")  # the engine steps again
        await eventually(
            lambda: _status(watch.base + "/livez", 200), timeout=30, what="/livez 200 again"
        )


async def _status(url: str, want: int) -> bool:
    return (await get(url))[0] == want
