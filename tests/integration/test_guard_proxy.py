"""The guard's proxy on its own (simulator tier): transparent to the same request
sent straight to the engine, a client that leaves closes its request in the engine, a slow
reader is never stuck, and bad options are one line. Against a real simulator (or a plain SSE
server) on loopback; the watchdog as the real console script where a judge is needed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
from pathlib import Path

import aiohttp
import pytest

from engine_watchdog.core.serving import GuardSettings
from engine_watchdog.guard import scan
from engine_watchdog.guard.proxy import Guard
from engine_watchdog.sim.launcher import SimProcess, free_port
from tests.tools.cli import run_cli
from tests.tools.guard import (
    completion,
    normalised,
    sim_requests,
    slow_reader,
    sse_server,
    start_guard,
    stop_guard,
    stream,
    upstream,
)
from tests.tools.watch import metric
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(180)
MODEL = "m"
STUCK_S = 3.0
"""--request-stall-seconds in these tests: short, so a wrong abort would show quickly."""


async def in_process_guard(sim: SimProcess, **settings: int) -> Guard:
    guard = Guard(GuardSettings(**settings), upstream(sim.url))  # type: ignore[arg-type]
    await guard.start("127.0.0.1", 0)
    return guard


async def test_the_guard_is_transparent() -> None:
    async with SimProcess("--served-model-name", MODEL) as sim:
        guard = await in_process_guard(sim, max_body_bytes=64 * 1024)
        url = f"http://127.0.0.1:{guard.port}"
        try:
            async with aiohttp.ClientSession() as s:
                chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
                for body in (completion(MODEL, 12), completion(MODEL, 5, stream=False)):
                    direct = await stream(s, sim.url, body, "same-a")
                    through = await stream(s, url, body, "same-b")
                    assert (through.status, through.headers["Content-Type"]) == (
                        direct.status,
                        direct.headers["Content-Type"],
                    )
                    assert normalised(through.events) == normalised(direct.events)
                    assert (
                        json.loads(through.body or b"{}").keys()
                        == json.loads(direct.body or b"{}").keys()
                    )
                async with s.post(url + "/v1/chat/completions", json=chat | {"stream": True}) as r:
                    assert r.status == 200 and b"[DONE]" in await r.read()
                # Status codes and bodies of errors, other methods and paths pass as they are.
                async with s.post(url + "/v1/completions", json={"model": "other"}) as r:
                    assert r.status == 404 and (await r.json())["error"]["type"] == "NotFoundError"
                async with s.get(url + "/no/such/path?x=1") as r:
                    assert r.status == 404
                async with s.get(url + "/v1/models") as r:
                    assert (await r.json())["data"][0]["id"] == MODEL
                async with s.head(url + "/health") as r:
                    assert r.status == 200
                # X-Request-Id: the client's kept; none added where it sent none (the engine
                # names the request itself, as it does straight).
                mine = await stream(s, url, completion(MODEL, 2), "mine-1")
                assert b'"id":"cmpl-mine-1' in mine.events[0]
                theirs = await stream(s, url, completion(MODEL, 2))
                assert re.search(rb'"id":"cmpl-[0-9a-f]{16,}', theirs.events[0]), theirs.events[0]
                # The body cap: refused before the engine sees it.
                big = completion(MODEL, 2) | {"prompt": "word " * 20000}
                async with s.post(url + "/v1/completions", json=big) as r:
                    assert r.status == 413
                    assert (await r.json())["error"]["code"] == 413
        finally:
            await guard.stop()
        assert guard.stats.outcomes["too-large"] == 1


async def test_a_client_that_leaves_closes_its_upstream_request() -> None:
    async with SimProcess("--served-model-name", MODEL) as sim:
        guard = await in_process_guard(sim)
        url = f"http://127.0.0.1:{guard.port}"
        try:
            async with aiohttp.ClientSession() as s:
                resp = await s.post(url + "/v1/completions", json=completion(MODEL, 5000))
                for _ in range(3):
                    await resp.content.readline()
                assert len(await sim_requests(sim)) == 1
                resp.close()  # the client goes away mid-stream
                for _ in range(50):
                    if not await sim_requests(sim):
                        break
                    await asyncio.sleep(0.1)
                assert await sim_requests(sim) == []
        finally:
            await guard.stop()
        assert guard.stats.outcomes["client-gone"] == 1


async def test_a_slow_reader_holds_its_own_stream_and_is_never_stuck(tmp_path: Path) -> None:
    """A client that stops reading fills the buffers until the guard waits on it (the trace's
    guard records show it waiting on the client, not on the engine); it is never called
    stuck, and gets every event once it reads again. The upstream is a plain SSE server with
    large events (a few seconds fill the kernel's socket buffers; the simulator's small ones
    would take minutes)."""
    trace = tmp_path / "guard.jsonl"
    async with sse_server() as upstream:
        args = ("--request-stall-seconds", str(STUCK_S), "--record", str(trace))
        guard = await start_guard("guard", upstream, *args)
        try:
            async with aiohttp.ClientSession() as s:
                small = {"events": 400, "size": 100, "interval": 0.05}
                others = [
                    asyncio.create_task(stream(s, guard.guard_url, small, f"o-{i}"))
                    for i in range(2)
                ]
                big = {"events": 400, "size": 16384, "interval": 0.002}
                raw = await slow_reader(guard.guard_url, big, pause_s=4 * STUCK_S)
                moving = await asyncio.gather(*others)
            text = await guard.metrics()
        finally:
            await stop_guard(guard)
    assert raw.count(b"data: [DONE]") == 1 and b'"error"' not in raw
    assert raw.count(b'data: {"text":"x') == 400
    assert all(m.done and m.error is None for m in moving)
    assert metric(text, "engine_watchdog_guard_stuck_requests_total") == 0
    held = [
        q
        for line in trace.read_text().splitlines()
        if (rec := json.loads(line)).get("kind") == "guard"
        for q in rec["quiet"]
        if q["label"] == "slow-1" and q["waiting_since"] is None
    ]
    assert len(held) >= 2 * STUCK_S, "the guard never waited on the slow client"


@pytest.mark.parametrize(
    ("args", "loop", "pure"),
    [((), "uvloop", False), (("--guard-loop", "asyncio"), "asyncio", False), ((), "uvloop", True)],
)
async def test_the_guard_runs_on_uvloop_unless_told_otherwise(
    args: tuple[str, ...], loop: str, pure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed guard's event loop is uvloop (docs/performance.md: its CPU per event);
    --guard-loop asyncio keeps the standard one. Its start-up line says which, and which
    per-event rules run (compiled where the install built guard/_relay.c, with the relay
    thread), and a stream passes whole on either (and on the Python twin,
    ENGINE_WATCHDOG_PURE_PYTHON=1)."""
    if pure:
        monkeypatch.setenv(scan.PURE_ENV, "1")
    async with sse_server() as upstream:
        guard = await start_guard("guard", upstream, *args, log=True)
        try:
            assert guard.proc.stderr is not None
            started = await asyncio.wait_for(read_until(guard.proc.stderr, b"guard on "), 10)
            async with aiohttp.ClientSession() as s:
                body = {"events": 20, "size": 50, "interval": 0.01, "stream": True}
                got = await stream(s, guard.guard_url, body, "loop-1")
        finally:
            await stop_guard(guard)
    line = started.strip()  # one JSON object under --json (docs/logs.md), plain text otherwise
    said = str(json.loads(line)["msg"]) if line.startswith(b"{") else line.decode()
    kind = "compiled, relay thread" if scan.COMPILED and not pure else "Python"
    assert said.endswith(f"(event loop: {loop}, per-event rules: {kind})"), said
    assert got.done and got.error is None and len(got.events) == 21


async def test_uvloop_asked_for_and_missing_is_one_line_and_exit_64(tmp_path: Path) -> None:
    """--guard-loop uvloop where uvloop cannot be imported (a sitecustomize hides it, as if it
    were not installed): one line naming both fixes, the usage exit code, nothing started."""
    (tmp_path / "sitecustomize.py").write_text('import sys\nsys.modules["uvloop"] = None\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    argv = ("--no-gpu", "--guard-loop", "uvloop", "--guard-listen", f"127.0.0.1:{free_port()}")
    ran = await run_cli("guard", "http://127.0.0.1:1", *argv, timeout=30, env=env)
    assert ran.code == 64, ran.err
    assert len(ran.err.strip().splitlines()) == 1, ran.err
    assert "pip install uvloop" in ran.err and "--guard-loop asyncio" in ran.err


async def read_until(stream: asyncio.StreamReader, text: bytes) -> bytes:
    """The first line of ``stream`` that holds ``text`` (stripped)."""
    while line := await stream.readline():
        if text in line:
            return line.strip()
    raise AssertionError(f"no line with {text!r}")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--guard-listen", "nonsense"), "--guard-listen 'nonsense': give host:port"),
        (("--request-action", "kill"), "Invalid value for '--request-action'"),
        (("--guard-loop", "libuv"), "Invalid value for '--guard-loop'"),
        (("--guard-listen", "127.0.0.1:{taken}"), "give a free host:port"),
    ],
)
async def test_bad_guard_options_are_one_line_and_exit_64(args: tuple[str, ...], says: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [a.format(taken=port) for a in args]
        ran = await run_cli("guard", "http://127.0.0.1:1", "--no-gpu", *argv, timeout=30)
    assert ran.code == 64, ran.err
    assert says in ran.err and len(ran.err.strip().splitlines()) == 1, ran.err


async def test_a_request_whose_body_was_coming_when_the_stall_was_judged_gets_503() -> None:
    """A stall judged while a request's body is still on its way: the guard refuses and ends
    every request in flight at once, this one not yet among them. Once its body is in, it is
    answered 503 like the requests after it, not passed on to hang on the stalled engine."""
    async with SimProcess("--served-model-name", MODEL) as sim:
        guard = await in_process_guard(sim)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", guard.port)
            body = json.dumps(completion(MODEL, 50)).encode()
            head = "POST /v1/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
            await writer.drain()
            await eventually(
                lambda: any(c.busy for c in guard.conns.by_transport.values()),
                10,
                what="the handler waits on the body",
            )
            guard.refuse("the engine stalled")  # what the supervisor does at the verdict
            assert guard.end_all("the engine stalled") == 0  # it was not in flight yet
            writer.write(body[10:])
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 10)
            rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert status.startswith(b"HTTP/1.1 503"), status
            assert b"Retry-After: 5" in rest
            assert guard.stats.outcomes["refused"] == 1 and not guard.open
            writer.close()
        finally:
            await guard.stop()
