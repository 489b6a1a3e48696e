"""`check` against real simulator processes: the issue's done-when cases."""

from __future__ import annotations

from engine_watchdog.sim.loadgen import StreamingLoad
from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.cli import run_cli
from tests.tools.watch import fired
from tests.waiting import eventually

STALL = "10"


async def test_check_says_stalled_on_the_seed_freeze_under_load(
    sim_factory: SimFactory, sim_http: SimHttp
) -> None:
    sim = await sim_factory("--tokens-per-second", "30")
    async with StreamingLoad(sim.url, clients=4, max_tokens=60, model="sim-model") as load:
        await load.wait_for(chunks=40, in_flight=3, timeout=30)
        await sim_http.set_fault(sim, "freeze-last")
        load.stop_new()
        await eventually(lambda: fired(sim_http, sim), timeout=30)
        ran = await run_cli("check", sim.url, "--json", "--stall-seconds", STALL)
        doc = ran.json()
        assert ran.code == 1, ran.out + ran.err
        # The simulated engine loop blocks on an event: its CPU is idle, so the evidence may
        # name a host-side deadlock; metrics alone say no-progress.
        assert doc["state"] == "stalled" and doc["cause"] in ("no-progress", "host-deadlock")
        assert doc["seconds_without_progress"] >= 5
        assert ran.seconds < float(STALL) + 5 + 5  # + process start-up on a loaded machine


async def test_check_says_healthy_under_load_and_on_an_idle_server(sim_factory: SimFactory) -> None:
    sim = await sim_factory("--tokens-per-second", "30")
    ran = await run_cli("check", sim.url, "--json", "--stall-seconds", STALL)
    # Idle is no proof (a wedged core looks idle): the canary answered is.
    assert (ran.code, ran.json()["evidence"]) == (0, "canary"), ran.out + ran.err
    async with StreamingLoad(sim.url, clients=3, max_tokens=200, model="sim-model") as load:
        await load.wait_for(chunks=20, in_flight=3, timeout=30)
        ran = await run_cli("check", sim.url, "--json", "--stall-seconds", STALL)
    assert (ran.code, ran.json()["state"]) == (0, "progressing"), ran.out + ran.err
    assert ran.seconds < 10


async def test_check_on_a_server_without_vllm_series_says_what_it_found(
    sim_factory: SimFactory,
) -> None:
    sim = await sim_factory("--disable-log-stats")
    ran = await run_cli("check", sim.url, "--stall-seconds", STALL)
    assert ran.code == 2
    # --engine auto: no engine's series at all; the line names what it found and each fix.
    assert "unknown engine" in ran.out and "process_" in ran.out
    assert "--disable-log-stats" in ran.out and "pass --engine" in ran.out
    assert ran.out.count("\n") == 1
