"""The same detection, against a simulator speaking each engine's metrics dialect.

For every dialect (vllm, sglang, tgi, llamacpp, trtllm): a streaming load must keep the REAL
watcher and detector out of suspect/stalled for longer than the stall window, /metrics must
auto-detect as that engine (the watcher runs with ``--engine auto``), and after ``freeze-last``
the verdict must reach ``stalled``. The five run side by side (one simulator each) so the file
stays within a minute.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
import pytest

from engine_watchdog.core.detector import DetectorSettings
from engine_watchdog.core.model import State
from engine_watchdog.core.settings import ProbeSettings, WatchSettings
from engine_watchdog.engines.detect import detect_profile
from engine_watchdog.runtime.watch.watcher import Watcher, watcher_for
from engine_watchdog.sim.launcher import SimProcess
from engine_watchdog.sim.loadgen import StreamingLoad
from engine_watchdog.sim.settings import DIALECTS
from tests.integration.conftest import SimFactory, SimHttp
from tests.waiting import eventually

STALL_S = 8.0
HEALTHY_S = STALL_S + 2.0  # longer than the stall window: a false stall would have shown
TICK_S = 0.5
STALL_DEADLINE_S = STALL_S + 15.0
BAD = {State.SUSPECT, State.STALLED, State.UNREACHABLE}


@dataclass
class Outcome:
    dialect: str
    detected: str | None = None
    watcher_engine: str | None = None
    healthy_states: set[State] = field(default_factory=set)
    stalled_after_s: float | None = None
    cause: str | None = None
    last: str = ""


def make_watcher(sim: SimProcess, dialect: str, session: aiohttp.ClientSession) -> Watcher:
    settings = WatchSettings(
        url=sim.url,
        engine="auto",  # the watcher must find the engine (and its metrics path) itself
        probe=ProbeSettings(canary=False, gpu=False, procs=False),
        detector=DetectorSettings(stall_seconds=STALL_S, startup_grace_seconds=0),
    )
    return watcher_for(settings, session)


async def states_for(watcher: Watcher, seconds: float) -> set[State]:
    """Tick for ``seconds``; every state any rank was in."""
    seen: set[State] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await watcher.tick()
        seen |= {v.state for v in watcher.verdicts.values()}
        await asyncio.sleep(TICK_S)
    return seen


async def until_stalled(watcher: Watcher, out: Outcome) -> None:
    started = time.monotonic()
    while time.monotonic() - started < STALL_DEADLINE_S:
        await watcher.tick()
        verdicts = list(watcher.verdicts.values())
        out.last = ", ".join(f"{v.engine}:{v.state.value}/{v.cause}" for v in verdicts)
        stalled = [v for v in verdicts if v.state is State.STALLED]
        if stalled:
            out.stalled_after_s, out.cause = time.monotonic() - started, stalled[0].cause
            return
        await asyncio.sleep(TICK_S)


async def fired(http: SimHttp, sim: SimProcess) -> bool:
    _, doc = await http.get(sim, "/sim/fault")
    return bool(doc["engines"]["0"].get("state") == "fired")


async def run_dialect(dialect: str, sim_factory: SimFactory, http: SimHttp) -> Outcome:
    out = Outcome(dialect)
    sim = await sim_factory("--dialect", dialect, "--tokens-per-second", "50")
    watcher = make_watcher(sim, dialect, http.session)
    try:
        # Short requests: trtllm's series move only when one completes.
        async with StreamingLoad(sim.url, clients=4, max_tokens=30, model="sim-model") as load:
            await load.wait_for(chunks=20, in_flight=3, timeout=30)
            out.healthy_states = await states_for(watcher, HEALTHY_S)
            async with http.session.get(sim.url + "/metrics") as resp:
                out.detected = detect_profile(await resp.text(), resp.status).engine
            await http.set_fault(sim, "freeze-last")
            load.stop_new()
            await eventually(lambda: fired(http, sim), timeout=20, what=f"{dialect} freeze")
            await until_stalled(watcher, out)
            out.watcher_engine = watcher.prober.profile.name
    finally:
        watcher.close()
    return out


async def test_every_dialect_stalls_on_a_freeze_and_not_under_load(
    sim_factory: SimFactory, sim_http: SimHttp
) -> None:
    outcomes = await asyncio.gather(*(run_dialect(d, sim_factory, sim_http) for d in DIALECTS))
    for o in outcomes:  # shown with -s, and in the report of a failure
        seen = sorted(s.value for s in o.healthy_states)
        print(f"{o.dialect}: detected {o.detected}, under load {seen}, stalled ({o.cause}) "
              f"{o.stalled_after_s} s after the freeze fired")  # fmt: skip
    problems = []
    for o in outcomes:
        if o.detected != o.dialect or o.watcher_engine != o.dialect:
            problems.append(
                f"{o.dialect}: /metrics auto-detected as {o.detected}, by the watcher as "
                f"{o.watcher_engine}"
            )
        if State.PROGRESSING not in o.healthy_states or o.healthy_states & BAD:
            seen = sorted(s.value for s in o.healthy_states)
            problems.append(f"{o.dialect}: under load the verdicts were {seen}")
        if o.stalled_after_s is None:
            problems.append(
                f"{o.dialect}: no stall {STALL_DEADLINE_S} s after the freeze ({o.last})"
            )
        elif o.cause not in ("no-progress", "host-deadlock"):
            problems.append(f"{o.dialect}: stalled with cause {o.cause}")
    assert not problems, "\n".join(problems)
    for o in outcomes:  # the freeze fires before the last progress: at least the stall window
        assert o.stalled_after_s is not None and o.stalled_after_s >= STALL_S - 2 * TICK_S - 1


async def test_llamacpp_metrics_hang_with_the_engine_loop_and_health_does_not(
    sim_factory: SimFactory, sim_http: SimHttp
) -> None:
    sim = await sim_factory("--dialect", "llamacpp", "--tokens-per-second", "50")
    assert "llamacpp:n_decode_total" in await _text(sim_http, sim.url + "/metrics", 5.0)
    async with StreamingLoad(sim.url, clients=2, max_tokens=500, model="sim-model") as load:
        await load.wait_for(chunks=5, in_flight=2, timeout=20)
        await sim_http.set_fault(sim, "freeze-last")
        load.stop_new()
        await eventually(lambda: fired(sim_http, sim), timeout=20, what="llamacpp freeze")
        with pytest.raises(asyncio.TimeoutError):
            await _text(sim_http, sim.url + "/metrics", 2.0)
        assert await sim_http.health(sim) == 200  # the HTTP thread still answers
        await sim_http.set_fault(sim, "none")
        assert "llamacpp:n_decode_total" in await _text(sim_http, sim.url + "/metrics", 5.0)


async def test_trtllm_serves_prometheus_text_apart_from_its_json_stats(
    sim_factory: SimFactory, sim_http: SimHttp
) -> None:
    sim = await sim_factory("--dialect", "trtllm", "--tokens-per-second", "200")
    for _ in range(2):
        status, _doc = await sim_http.complete(sim, max_tokens=5)
        assert status == 200
    status, stats = await sim_http.get(sim, "/metrics")
    assert status == 200 and isinstance(stats, list)
    assert all({"iter", "numActiveRequests", "iterLatencyMS"} <= set(s) for s in stats)
    text = await _text(sim_http, sim.url + "/prometheus/metrics", 5.0)
    assert 'trtllm_request_success_total{model_name="undefined"' in text
    assert detect_profile(text, 200).engine == "trtllm"


async def _text(http: SimHttp, url: str, timeout: float) -> str:
    async with http.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        assert resp.status == 200
        return await resp.text()
