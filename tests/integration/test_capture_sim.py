"""Capture of a deadlocked simulator: the bundle's stacks show the blocked frame in the engine
core (fixtures from tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.capture.bundle import BundleSettings, write_bundle
from engine_watchdog.capture.pyspy import pyspy_step
from engine_watchdog.core.model import Cause, State, Verdict
from engine_watchdog.core.settings import CaptureSettings
from engine_watchdog.host.tools import resolve_tools
from engine_watchdog.probes.procs import sample_procs_async

pytestmark = pytest.mark.skipif(not resolve_tools().get("py-spy"), reason="py-spy not installed")


async def engine_fault_state(sim_http: Any, sim: Any) -> str:
    status, doc = await sim_http.get(sim, "/sim/fault")
    return str(doc["engines"]["0"]["state"]) if status == 200 else ""


async def capture_fired(
    fault: str, sim_factory: Any, sim_http: Any, poll: Any, tmp_path: Path
) -> tuple[Any, Any]:
    """A simulator whose ``fault`` has fired under one stream, captured: (result, processes)."""
    sim = await sim_factory("--fault", fault)
    events: list[Any] = []
    stream = asyncio.create_task(sim_http.stream(sim, events, max_tokens=50))
    try:

        async def fired() -> bool:
            return await engine_fault_state(sim_http, sim) == "fired"

        await poll(fired, timeout=20.0, what=f"{fault} fired in the engine core")
        obs = await sample_procs_async(sim.url)
        roles = {p.role for p in obs.procs}
        assert {"api-server", "engine-core"} <= roles
        verdict = Verdict(t=obs.t, engine="0", state=State.STALLED, cause=Cause.HOST_DEADLOCK)
        timeline = [{"t": obs.t, "kind": "procs", "procs": [p.pid for p in obs.procs]}]
        res = await write_bundle(
            BundleSettings(CaptureSettings(incident_dir=tmp_path)),
            verdict,
            obs.procs,
            timeline,
            [pyspy_step()],
        )
    finally:
        stream.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await stream
    return res, obs


async def test_bundle_of_a_deadlocked_simulator_shows_the_blocked_frame(
    sim_factory: Any, sim_http: Any, poll: Any, tmp_path: Path
) -> None:
    res, obs = await capture_fired("deadlock", sim_factory, sim_http, poll, tmp_path)
    assert res.steps[0].status == "ok", res.steps[0].detail
    core = next(p for p in obs.procs if p.role == "engine-core")
    stacks = json.loads((res.path / "pyspy" / f"{core.pid}.json").read_text())
    frames = [f["name"] for th in stacks for f in th["frames"]]
    assert any(name.endswith("_step_with_lock") for name in frames)
    summary = (res.path / "summary.md").read_text()
    assert "blocked acquiring a lock in _step_with_lock" in summary
    assert summary.startswith("# vllm stalled (host-deadlock)")
    assert res.path.name.endswith("Z-0-host-deadlock")  # its incident: engine 0, cause


@pytest.mark.parametrize("fault", ["deadlock", "spin"])
async def test_no_known_hang_is_claimed_for_a_simulated_fault(
    fault: str, sim_factory: Any, sim_http: Any, poll: Any, tmp_path: Path
) -> None:
    """The shipped signatures describe real engines' hangs; none is meant for the simulator's
    faults, so a match would be a wrong one."""
    res, _ = await capture_fired(fault, sim_factory, sim_http, poll, tmp_path)
    assert res.signature == "none" and res.manifest["known_hangs"] == []
    assert "Nothing in this bundle matches a known hang" in (res.path / "summary.md").read_text()
