"""Fixtures for integration tests against the engine simulator: real processes, loopback only.

``sim_factory`` starts simulators (``await sim_factory("--fault", "freeze-last")`` returns a
started :class:`~engine_watchdog.sim.launcher.SimProcess`); every one is stopped (its whole
process group) when the test ends, pass or fail, and its log tail is printed, so a failing
test's report shows it. ``sim_http`` is a small HTTP helper bound to the test's session:
scrape and parse /metrics, complete, stream, set faults, and poll with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from engine_watchdog.sim.launcher import SimProcess
from tests.tools.stub_engine import Route, StubEngine
from tests.tools.watch import WatchProcess, start_watch, stop_watch
from tests.waiting import eventually

T = TypeVar("T")
SimFactory = Callable[..., Awaitable[SimProcess]]


@pytest.fixture
async def sim_factory(tmp_path: Path) -> AsyncIterator[SimFactory]:
    sims: list[SimProcess] = []

    async def start(
        *args: str,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 30.0,
        port: int | None = None,
    ) -> SimProcess:
        log_path = tmp_path / f"sim-{len(sims)}.log"  # pytest keeps the last runs' tmp dirs
        sim = SimProcess(
            *args, env=env, startup_timeout=startup_timeout, log_path=log_path, port=port
        )
        sims.append(sim)
        await sim.start()
        return sim

    try:
        yield start
    finally:
        await asyncio.gather(*(sim.stop() for sim in sims), return_exceptions=True)
        for sim in sims:
            tail = "\n".join(sim.log_text().splitlines()[-25:])
            print(f"--- simulator {sim.args} log tail ({sim.log_path}) ---\n{tail}")


StubFactory = Callable[..., Awaitable[StubEngine]]


@pytest.fixture
async def stub_engine() -> AsyncIterator[StubFactory]:
    """Start stand-in engine servers in this test's loop (tests/tools/stub_engine.py):
    ``await stub_engine({"/health": lambda: Body(endless=True)}, api_key=..., tls=ctx)``;
    every one is stopped when the test ends."""
    stubs: list[StubEngine] = []

    async def start(
        routes: dict[str, Route] | None = None,
        api_key: str | None = None,
        tls: ssl.SSLContext | None = None,
        basic: str | None = None,
    ) -> StubEngine:
        stub = StubEngine(routes=dict(routes or {}), api_key=api_key, basic=basic)
        stubs.append(stub)
        return await stub.start(tls)

    try:
        yield start
    finally:
        await asyncio.gather(*(stub.stop() for stub in stubs), return_exceptions=True)


@dataclass(frozen=True)
class Scrape:
    """One parsed /metrics answer."""

    families: dict[str, Metric]

    def value(self, sample: str, **labels: str) -> float:
        """The value of the first sample of that name whose labels include ``labels``."""
        for fam in self.families.values():
            for s in fam.samples:
                if s.name == sample and labels.items() <= s.labels.items():
                    return float(s.value)
        raise KeyError(f"no sample {sample}{labels}")

    def names(self) -> set[str]:
        return {s.name for fam in self.families.values() for s in fam.samples}


class SimHttp:
    """HTTP helpers for simulator tests (one aiohttp session per test)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def scrape(self, sim: SimProcess, timeout: float = 5.0) -> Scrape:
        async with self.session.get(sim.url + "/metrics", timeout=_t(timeout)) as resp:
            assert resp.status == 200
            text = await resp.text()
        return Scrape({f.name: f for f in text_string_to_metric_families(text)})

    async def health(self, sim: SimProcess, timeout: float = 2.0) -> int | None:
        """/health's status code; None if nothing answers."""
        try:
            async with self.session.get(sim.url + "/health", timeout=_t(timeout)) as resp:
                return resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    async def post(
        self, sim: SimProcess, path: str, body: Any = None, timeout: float = 10.0, **kw: Any
    ) -> tuple[int, Any]:
        async with self.session.post(sim.url + path, json=body, timeout=_t(timeout), **kw) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text else None

    async def get(self, sim: SimProcess, path: str, timeout: float = 10.0) -> tuple[int, Any]:
        async with self.session.get(sim.url + path, timeout=_t(timeout)) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text else None

    async def complete(
        self,
        sim: SimProcess,
        chat: bool = False,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        **body: Any,
    ) -> tuple[int, Any]:
        """A non-streaming completion; ``body`` adds to or overrides the defaults."""
        path, doc = _request(chat, body)
        return await self.post(sim, path, doc, timeout=timeout, headers=headers)

    async def stream(
        self, sim: SimProcess, events: list[Any], chat: bool = False, **body: Any
    ) -> list[Any]:
        """A streaming completion; every SSE event (parsed JSON, or ``"[DONE]"``) is appended
        to ``events`` as it arrives, so a test can watch a stream that never ends."""
        path, doc = _request(chat, {**body, "stream": True})
        async with self.session.post(sim.url + path, json=doc, timeout=_t(120.0)) as resp:
            assert resp.status == 200, await resp.text()
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    data = line.removeprefix("data: ")
                    events.append(data if data == "[DONE]" else json.loads(data))
        return events

    async def set_fault(self, sim: SimProcess, fault: str, **params: Any) -> Any:
        status, doc = await self.post(sim, "/sim/fault", {"fault": fault, **params})
        assert status == 200, doc
        return doc


def _request(chat: bool, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if chat:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **body}
    return "/v1/completions", {"prompt": "hello there", **body}


def _t(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


async def steady(
    read: Callable[[], Awaitable[T]], seconds: float, interval: float = 0.2, what: str = "value"
) -> T:
    """Observe ``read`` for ``seconds``; fail if it ever changes. An observation window (the
    claim is "does not move for this long"), not a sleep used to wait for something."""
    first = await read()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(interval)
        now = await read()
        assert now == first, f"{what} moved: {first!r} -> {now!r}"
    return first


@pytest.fixture
async def sim_http() -> AsyncIterator[SimHttp]:
    async with aiohttp.ClientSession() as session:
        yield SimHttp(session)


@pytest.fixture
def poll() -> Callable[..., Awaitable[Any]]:
    """:func:`eventually`, as a fixture (test modules here are not a package)."""
    return eventually


@pytest.fixture
def hold() -> Callable[..., Awaitable[Any]]:
    """:func:`steady`, as a fixture."""
    return steady


@pytest.fixture
async def watch_factory() -> AsyncIterator[Callable[..., Awaitable[WatchProcess]]]:
    """Starts ``engine-watchdog watch`` processes; every one is killed when the test ends."""
    started: list[WatchProcess] = []

    async def start(url: str, *args: str) -> WatchProcess:
        started.append(await start_watch(url, *args))
        return started[-1]

    yield start
    for watch in started:
        await stop_watch(watch)
