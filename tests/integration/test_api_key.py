"""An engine started with an API key, on the simulator (fast; tests/e2e/test_api_key.py does it
on a real vLLM).

The simulator guards /v1 with the key in VLLM_API_KEY, as vLLM does with --api-key. The watchdog
reads its key from --api-key-file, ENGINE_WATCHDOG_API_KEY or VLLM_API_KEY; without one, its
canary gets 401, which it says once, naming the fix. The key appears nowhere the watchdog
writes: log, stdout, trace, incident bundle, /status, /metrics, its own command line."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from engine_watchdog.core.model import Result
from engine_watchdog.core.settings import Secret
from engine_watchdog.engines import VLLM
from engine_watchdog.net.access import Access
from engine_watchdog.net.connection import EngineConnection
from engine_watchdog.recovery.abort import abort_requests
from engine_watchdog.sim.loadgen import StreamingLoad
from tests.integration.conftest import SimFactory, SimHttp
from tests.tools.watch import WatchProcess, get, start_watch, stop_watch
from tests.waiting import eventually

KEY = "sk-test-4f1c2a9e-never-in-a-file"
SIM_ENV = {"VLLM_API_KEY": KEY}
QUICK = ("--no-gpu", "--action", "none", "--canary-after", "1", "--idle-canary-interval", "1")


def _canaries(trace: Path) -> list[dict[str, Any]]:
    if not trace.exists():
        return []
    return [r for r in map(json.loads, trace.read_text().splitlines()) if r["kind"] == "canary"]


async def _everything_written(watch: WatchProcess, files: list[Path]) -> str:
    """All the watchdog wrote or serves, and its own command line, as one text."""
    _, status = await get(f"{watch.base}/status")
    _, metrics = await get(f"{watch.base}/metrics")
    argv = " ".join(psutil.Process(watch.proc.pid).cmdline())
    texts = [status, metrics, argv, *(json.dumps(line) for line in watch.lines)]
    for f in files:
        paths = [f] if f.is_file() else [p for p in f.rglob("*") if p.is_file()]
        texts += [p.read_bytes().decode(errors="replace") for p in paths]
    return "\n".join(texts)


async def test_the_canary_authenticates_from_a_file_or_the_environment(
    sim_factory: SimFactory, tmp_path: Path
) -> None:
    sim = await sim_factory(env=SIM_ENV)
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    base = {k: v for k, v in os.environ.items() if k not in SIM_ENV}
    ways: dict[str, tuple[list[str], dict[str, str]]] = {
        "file": (["--api-key-file", str(key_file)], base),
        "ENGINE_WATCHDOG_API_KEY": ([], {**base, "ENGINE_WATCHDOG_API_KEY": KEY}),
        "VLLM_API_KEY": ([], {**base, "VLLM_API_KEY": KEY}),
        "none": ([], base),
    }
    watches: dict[str, WatchProcess] = {}
    try:
        for way, (args, env) in ways.items():
            trace, log = tmp_path / f"{way}.jsonl", tmp_path / f"{way}.log"
            watches[way] = await start_watch(
                sim.url, *QUICK, *args, "--record", str(trace), stderr=log, env=env
            )

        def counts() -> dict[str, int]:
            return {w: len(_canaries(tmp_path / f"{w}.jsonl")) for w in ways}

        def enough() -> bool:  # three canaries each: "once" must mean once, not "one round"
            return all(n >= 3 for n in counts().values())

        try:
            await eventually(enough, timeout=45, interval=0.5, what="three canaries each")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {counts()}") from None
        written = {w: await _everything_written(watches[w], []) for w in ways}
    finally:
        await asyncio.gather(*(stop_watch(w) for w in watches.values()))
    for way in ways:
        canaries = _canaries(tmp_path / f"{way}.jsonl")
        if way == "none":
            assert {c["error"] for c in canaries} == {"unusable: /v1/models answered HTTP 401"}
        else:
            assert all(c["ok"] for c in canaries), (way, [c["error"] for c in canaries])
        said = (tmp_path / f"{way}.log").read_text()
        assert said.count("--api-key-file") == (1 if way == "none" else 0), said
        files = [tmp_path / f"{way}.jsonl", tmp_path / f"{way}.log"]
        assert KEY not in written[way] + "".join(f.read_text() for f in files), way


async def test_a_hang_only_the_canary_reveals_is_stalled_fast_and_the_key_stays_secret(
    sim_factory: SimFactory, sim_http: SimHttp, tmp_path: Path
) -> None:
    """The engine core blocks inside a step (a real deadlock) under load: the keyed canary times
    out and the verdict comes at --fast-stall-seconds, not --stall-seconds; the incident bundle
    is written, and holds the key nowhere (the simulator's own environment is redacted)."""
    sim = await sim_factory(env=SIM_ENV)
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY)
    incidents, trace, log = tmp_path / "incidents", tmp_path / "trace.jsonl", tmp_path / "log"
    auth = {"Authorization": f"Bearer {KEY}"}
    async with StreamingLoad(sim.url, clients=3, model="sim-model", headers=auth) as load:
        await load.wait_for(chunks=20, in_flight=2, timeout=30)
        watch = await start_watch(
            sim.url, "--no-gpu", "--api-key-file", str(key_file), "--record", str(trace),
            "--incident-dir", str(incidents), "--action", "capture", "--stall-seconds", "30",
            "--canary-after", "2", "--canary-timeout", "3", "--fast-stall-seconds", "6",
            stderr=log,
        )  # fmt: skip
        try:
            await watch.next_state("progressing", timeout=20)
            await sim_http.set_fault(sim, "deadlock")
            stalled = await watch.next_state("stalled", timeout=25)
            await eventually(lambda: list(incidents.glob("*/manifest.json")), timeout=60)
            written = await _everything_written(watch, [incidents, trace, log])
        finally:
            await stop_watch(watch)
            await sim_http.set_fault(sim, "none")
    assert stalled["seconds_without_progress"] < 20, stalled  # the canary's doing, not 30 s
    failed = [c for c in _canaries(trace) if c["error"] == "timeout"]
    assert failed and failed[0]["t"] <= stalled["t"], _canaries(trace)  # the canary said so
    assert KEY not in written
    assert "VLLM_API_KEY" in written  # the bundle did record the engine's environment


async def test_the_abort_rung_sends_the_key_where_the_engine_guards_its_abort(
    sim_factory: SimFactory,
) -> None:
    """vLLM guards /inference (its scale-out abort) with the key too: without it the abort
    rung got 401 and the ladder went on to a restart for nothing."""
    sim = await sim_factory("--enable-scale-out", env=SIM_ENV)
    async with aiohttp.ClientSession() as session:
        keyless = await abort_requests(session, EngineConnection.of(sim.url), VLLM, ["canary-1"])
        keyed_conn = EngineConnection.of(sim.url, Access(api_key=Secret(KEY)))
        keyed = await abort_requests(session, keyed_conn, VLLM, ["canary-1"])
    assert keyless.result is Result.NOT_AVAILABLE and "401" in keyless.detail, keyless
    assert keyed.result is Result.OK, keyed
    assert KEY not in keyed.detail + keyless.detail
