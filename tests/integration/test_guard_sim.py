"""The guard in front of the simulator (issue 15, simulator tier): transparent, one stuck
request aborted while the others complete, a frozen engine's clients answered at once and new
requests refused, requests passing again after a restart, and every legitimate quiet case left
alone.

The watchdog runs as the real console script (``guard`` or ``run --guard-listen``); the pure
proxy tests run the Guard in this process, against a real simulator on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from engine_watchdog.core.settings import GuardSettings
from engine_watchdog.guard.proxy import Guard
from engine_watchdog.sim.launcher import SimProcess, free_port
from tests.tools.cli import run_cli
from tests.tools.guard import (
    GuardProcess,
    completion,
    post_json,
    start_guard,
    stop_guard,
    stream,
)
from tests.tools.watch import metric

pytestmark = pytest.mark.timeout(180)
MODEL = "m"
STUCK_S = 3.0
"""--request-stall-seconds in these tests: short, so a wrong abort would show quickly."""


async def in_process_guard(sim: SimProcess, **settings: int) -> Guard:
    guard = Guard(GuardSettings(**settings), sim.url)  # type: ignore[arg-type]
    await guard.start("127.0.0.1", 0)
    return guard


def normalised(events: list[bytes]) -> list[bytes]:
    """The events with what legitimately differs between two identical requests blanked: the
    creation second and the request id."""
    out = []
    for e in events:
        e = re.sub(rb'"created":\d+', b'"created":0', e)
        out.append(re.sub(rb'"id":"(chat)?cmpl-[^"]*"', b'"id":"-"', e))
    return out


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
                # X-Request-Id: the client's kept, one set where it sent none (vLLM's request id).
                mine = await stream(s, url, completion(MODEL, 2), "mine-1")
                assert b'"id":"cmpl-mine-1"' in mine.events[0]
                theirs = await stream(s, url, completion(MODEL, 2))
                assert re.search(rb'"id":"cmpl-[0-9a-f]{32}"', theirs.events[0]), theirs.events[0]
                # The body cap: refused before the engine sees it.
                big = completion(MODEL, 2) | {"prompt": "word " * 20000}
                async with s.post(url + "/v1/completions", json=big) as r:
                    assert r.status == 413
                    assert (await r.json())["error"]["code"] == 413
        finally:
            await guard.stop()
        assert guard.stats.outcomes["too-large"] == 1


async def sim_requests(sim: SimProcess) -> list[dict[str, object]]:
    doc = await get_json(sim.url + "/sim/requests")
    rows: list[dict[str, object]] = doc["requests"]
    return rows


async def get_json(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        doc: dict[str, Any] = await r.json()
        return doc


async def sim_metric(sim: SimProcess, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/metrics") as r:
        return metric(await r.text(), name, **labels) or 0.0


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


@contextlib.asynccontextmanager
async def watched(
    sim: SimProcess, *args: str, command: str = "guard", tail: tuple[str, ...] = ()
) -> AsyncIterator[GuardProcess]:
    guard = await start_guard(command, sim.url, *args, tail=tail)
    try:
        yield guard
    finally:
        await stop_guard(guard)


async def test_only_the_stuck_request_is_aborted_and_the_others_complete() -> None:
    async with SimProcess("--served-model-name", MODEL, "--tokens-per-second", "50") as sim:
        async with watched(sim, "--request-stall-seconds", str(STUCK_S)) as g:
            await post_json(sim.url + "/sim/fault", {"fault": "stuck-request"})
            async with aiohttp.ClientSession() as s:
                ids = ["ok-1", "ok-2", "stuck-1", "ok-3"]
                tasks = [
                    asyncio.create_task(stream(s, g.guard_url, completion(MODEL, 400), rid))
                    for rid in ids
                ]
                await tasks[2]
                await asyncio.sleep(0.5)  # the engine's API notices its client gone
                in_engine = {str(r["request_id"]) for r in await sim_requests(sim)}
                results = await asyncio.gather(*tasks)
            text = await g.metrics()
        got = dict(zip(ids, results, strict=True))
        stuck = got.pop("stuck-1")
        assert stuck.error is not None and stuck.done, stuck.events[-3:]
        assert (stuck.error["type"], stuck.error["code"]) == ("ServiceUnavailableError", 503)
        silence = stuck.times[-1] - stuck.times[-3]  # from its last token to the error
        assert STUCK_S <= silence <= STUCK_S + 2.5, silence
        for other in got.values():
            assert other.error is None and other.done and other.tokens == 400
        assert metric(text, "engine_watchdog_guard_stuck_requests_total") == 1
        assert metric(text, "engine_watchdog_guard_aborted_requests_total", reason="stuck") == 1
        assert "stalled" not in {d["state"] for d in g.lines}, g.states()
        # Ended in the engine too (the guard closed its connection): the others still run there.
        assert in_engine == {"cmpl-ok-1", "cmpl-ok-2", "cmpl-ok-3"}, in_engine


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
    assert raw.count(b"data: x") == 400
    assert all(m.done and m.error is None for m in moving)
    assert metric(text, "engine_watchdog_guard_stuck_requests_total") == 0
    held = [
        q
        for line in trace.read_text().splitlines()
        if (rec := json.loads(line)).get("kind") == "guard"
        for q in rec["quiet"]
        if q["id"] == "slow-1" and q["waiting_since"] is None
    ]
    assert len(held) >= 2 * STUCK_S, "the guard never waited on the slow client"


@contextlib.asynccontextmanager
async def sse_server() -> AsyncIterator[str]:
    """POST /v1/completions {"events", "size", "interval"}: that many SSE events of that size."""

    async def completions(request: web.Request) -> web.StreamResponse:
        spec = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        event = b"data: " + b"x" * int(spec["size"]) + b"\n\n"
        for _ in range(int(spec["events"])):
            await resp.write(event)
            await asyncio.sleep(float(spec["interval"]))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def slow_reader(url: str, body: dict[str, Any], pause_s: float) -> bytes:
    """A raw client with a small receive buffer that reads a little, stops reading for
    ``pause_s``, then reads to the end."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nX-Request-Id: slow-1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    await loop.sock_sendall(sock, head.encode() + payload)
    data = await loop.sock_recv(sock, 1024)
    await asyncio.sleep(pause_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # now read it all, quickly
    async with asyncio.timeout(60):
        while chunk := await loop.sock_recv(sock, 65536):
            data += chunk
    sock.close()
    return data


async def test_a_frozen_engine_s_clients_are_answered_at_once_and_new_ones_refused() -> None:
    async with (
        SimProcess("--served-model-name", MODEL, "--tokens-per-second", "25") as sim,
        watched(sim, "--action", "answer", "--startup-grace", "0") as g,
        aiohttp.ClientSession() as s,
    ):
        clients = [
            asyncio.create_task(stream(s, g.guard_url, completion(MODEL, 5000), f"c-{i}"))
            for i in range(6)
        ]
        await g.wait_state("progressing", 20)
        await asyncio.sleep(2)
        os.kill(sim.engine_pids()[0], signal.SIGSTOP)
        try:
            verdict = await g.wait_state("stalled", 20)
            refused = await stream(s, g.guard_url, completion(MODEL, 5))
            refused_t = time.time()
            answered = await asyncio.wait_for(asyncio.gather(*clients), 10)
        finally:
            os.kill(sim.engine_pids()[0], signal.SIGCONT)
        await g.wait_state("idle", 30, since=verdict["read_t"])
        again = await stream(s, g.guard_url, completion(MODEL, 5))
    last_token = max(t for c in answered for t in c.times[:-2])
    assert verdict["t"] - last_token <= 6.0, verdict  # the target: within 6 s of the last event
    assert verdict["cause"] == "stopped", verdict
    for c in answered:
        assert c.error is not None and c.done, c.events[-2:]
        assert c.times[-1] <= verdict["t"] + 1.0, (c.times[-1], verdict["t"])
    assert refused.status == 503 and refused.headers["Retry-After"] == "5"
    assert refused_t <= verdict["read_t"] + 1.0
    assert again.status == 200 and again.done and again.error is None


async def test_in_supervise_mode_requests_pass_again_after_the_restart(tmp_path: Path) -> None:
    port = free_port()
    engine = (
        *(sys.executable, "-m", "engine_watchdog.sim", "--port", str(port)),
        *("--served-model-name", MODEL, "--tokens-per-second", "25"),
    )
    url = f"http://127.0.0.1:{port}"
    args = ("--action", "answer,restart", "--incident-dir", str(tmp_path), "--startup-grace", "0")
    guard = await start_guard("run", url, *args, tail=engine)
    try:
        await guard.wait_state("idle", 30)
        async with aiohttp.ClientSession() as s:
            client = asyncio.create_task(stream(s, guard.guard_url, completion(MODEL, 5000), "c"))
            await guard.wait_state("progressing", 20)
            await post_json(url + "/sim/fault", {"fault": "freeze-last"})
            answered = await asyncio.wait_for(client, 30)
            during = await stream(s, guard.guard_url, completion(MODEL, 5))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                after = await stream(s, guard.guard_url, completion(MODEL, 5))
                if after.status == 200:
                    break
                await asyncio.sleep(0.5)
    finally:
        await stop_guard(guard)
    assert answered.error is not None and answered.done
    assert during.status == 503
    assert after.status == 200 and after.done and after.error is None, after
    assert "starting(restarting)" in guard.states(), guard.states()


async def test_legitimate_quiet_is_never_stuck_nor_stalled() -> None:
    """Queueing before the first token, preemption, a long prefill, a slow decode and a very
    long generation, each with a short --request-stall-seconds: no request aborted, no stall."""
    sim_args = ("--served-model-name", MODEL, "--tokens-per-second", "40", "--max-num-seqs", "3")
    async with SimProcess(*sim_args, "--kv-capacity-tokens", "300") as sim:
        async with watched(sim, "--request-stall-seconds", str(STUCK_S)) as g:
            async with aiohttp.ClientSession() as s:

                def many(n: int, tokens: int, tag: str) -> list[asyncio.Task[object]]:
                    return [
                        asyncio.create_task(
                            stream(s, g.guard_url, completion(MODEL, tokens), f"{tag}{i}")
                        )
                        for i in range(n)
                    ]

                results = await asyncio.gather(*many(8, 120, "queue-"))  # 5 wait, some preempted
                await post_json(
                    sim.url + "/sim/fault", {"fault": "long-prefill", "long_prefill_seconds": 6}
                )
                results += await asyncio.gather(*many(3, 150, "prefill-"))
                await post_json(
                    sim.url + "/sim/fault", {"fault": "slow", "slow_tokens_per_second": 0.25}
                )
                slow = many(2, 6, "slow-")
                long = many(1, 280, "long-")
                await asyncio.sleep(12)
                await post_json(sim.url + "/sim/fault", {"fault": "none"})
                results += await asyncio.gather(*slow, *long)
            text = await g.metrics()
        preempted = await sim_metric(sim, "vllm:num_preemptions_total")
    assert preempted > 0, "the queueing phase preempted nothing: the case is not covered"
    errors = [r for r in results if getattr(r, "error", None) or not getattr(r, "done", False)]
    assert errors == []
    assert metric(text, "engine_watchdog_guard_stuck_requests_total") == 0
    assert "stalled" not in {d["state"] for d in g.lines}, g.states()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--guard-listen", "nonsense"), "--guard-listen 'nonsense': give host:port"),
        (("--request-action", "kill"), "Invalid value for '--request-action'"),
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
