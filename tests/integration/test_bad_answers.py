"""One bad engine must not take the others down. A fleet of stand-in engines
(real aiohttp servers on loopback), each giving one kind of bad answer from tests/data/bad_input,
beside one good simulated vLLM: `check` and `watch`, through the installed console script, judge
the good one and report the bad ones, and never crash (it was: a traceback and exit 1 for
`check`, exit 70 for `watch`)."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from typing import Any

import aiohttp

from tests.integration.conftest import SimFactory, StubFactory
from tests.tools.cli import run_cli
from tests.tools.stub_engine import Body, Route, StubEngine, bad_input, vllm_exposition
from tests.tools.watch import get, metric, start_watch, stop_watch
from tests.waiting import eventually

JSON = "application/json"
BAD_MODELS = [
    "models_garbage.bin",
    "models_list.json",
    "models_null.json",
    "models_data_number.json",
    "models_truncated.json",
    "models_deep.json",
]
BAD_COMPLETIONS = [
    "completion_garbage.bin",
    "completion_choices_object.json",
    "completion_choices_number.json",
]
CANARY_SOON = ("--canary-after", "1", "--suspect-seconds", "10", "--stall-seconds", "20")


def _busy_flat() -> Body:
    """Work present and nothing moving: the watchdog sends its canary (after --canary-after)."""
    return Body(vllm_exposition(running=1.0, tokens=7.0))


def _serving(name: str) -> Body:
    return Body(bad_input(name), content_type=JSON)


async def _bad_fleet(stub_engine: StubFactory) -> dict[str, StubEngine]:
    """One stand-in engine per kind of bad answer, by the kind's name."""
    fleet: dict[str, StubEngine] = {}
    for name in BAD_MODELS:
        routes: dict[str, Route] = {"/metrics": _busy_flat, "/v1/models": partial(_serving, name)}
        fleet[name] = await stub_engine(routes)
    for name in BAD_COMPLETIONS:
        routes = {"/metrics": _busy_flat, "/v1/completions": partial(_serving, name)}
        fleet[name] = await stub_engine(routes)
    endless = {"/metrics": _busy_flat, "/v1/models": lambda: Body(endless=True)}
    fleet["endless /v1/models"] = await stub_engine(endless)
    garbage = {"/metrics": lambda: Body(bad_input("metrics_garbage.bin"))}
    fleet["metrics_garbage.bin"] = await stub_engine(garbage)
    return fleet


def _canaried(stub: StubEngine) -> bool:
    return any(path == "/v1/completions" or path == "/v1/models" for _, path, _ in stub.seen)


async def test_check_judges_the_good_engine_beside_every_kind_of_bad_one(
    sim_factory: SimFactory, stub_engine: StubFactory
) -> None:
    good = await sim_factory()
    fleet = await _bad_fleet(stub_engine)
    urls = [good.url, *(s.url for s in fleet.values())]
    ran = await run_cli("check", *urls, "--json", *CANARY_SOON, "--timeout", "5")
    assert "Traceback" not in ran.err, ran.err
    doc = ran.json()
    states = {t["target"]: t["state"] for t in doc["targets"]}
    evidence = {t["target"]: t["evidence"] for t in doc["targets"]}
    # Idle is no proof: the good engine is healthy by its canary's answer.
    assert evidence[good.url] == "canary" and states[good.url] != "stalled", doc
    assert states[fleet["metrics_garbage.bin"].url] == "unreachable"
    assert ran.code == 2, ran.out + ran.err  # the worst: one target is no engine at all
    canaried = [name for name, stub in fleet.items() if name != "metrics_garbage.bin"]
    assert all(_canaried(fleet[name]) for name in canaried)  # every bad answer was met


async def _probe_errors(base: str, targets: list[str]) -> dict[str, float] | None:
    """Failed canaries per target, from the watchdog's own /metrics (None: not serving yet)."""
    try:
        _, text = await get(f"{base}/metrics")
    except aiohttp.ClientError:
        return None
    name = "engine_watchdog_probe_errors_total"
    return {t: metric(text, name, target=t, probe="canary") or 0.0 for t in targets}


async def test_watch_keeps_watching_the_good_engine_beside_every_kind_of_bad_one(
    sim_factory: SimFactory, stub_engine: StubFactory
) -> None:
    good = await sim_factory()
    fleet = await _bad_fleet(stub_engine)
    canaried = [s.url for name, s in fleet.items() if name != "metrics_garbage.bin"]
    watch = await start_watch(
        good.url, *(s.url for s in fleet.values()), "--action", "none", *CANARY_SOON
    )
    try:

        async def every_bad_canary_failed() -> Any:
            assert watch.proc.returncode is None, f"watch exited {watch.proc.returncode}"
            errors = await _probe_errors(watch.base, canaried)
            return errors is not None and all(errors[u] >= 1 for u in canaried)

        await eventually(every_bad_canary_failed, timeout=30, interval=0.5, what="bad canaries")
        await asyncio.sleep(2.0)  # rounds after the bad answers were judged
        _, status = await get(f"{watch.base}/status")
        engines = {e["target"]: e["state"] for e in json.loads(status)["engines"]}
        assert engines[good.url] == "idle", engines
        assert watch.proc.returncode is None, "watch exited"
    finally:
        await stop_watch(watch)
