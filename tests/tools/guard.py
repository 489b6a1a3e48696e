"""The guard as tests see it: ``engine-watchdog guard`` (or ``run --guard-listen``) as a real
process, and streaming clients that keep every SSE event they got, and when."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from engine_watchdog.net.connection import EngineConnection, Upstream
from engine_watchdog.sim.launcher import SimProcess, free_port
from tests.tools.cli import CONSOLE_SCRIPT
from tests.tools.watch import metric


def upstream(url: str) -> Upstream:
    """The guard's side of an engine URL, as the watchdog builds it (net/connection.py)."""
    return EngineConnection.of(url).upstream()


@dataclass
class GuardProcess:
    """A watchdog process with a guard: ``guard_url`` for clients, ``base`` for its own API;
    every JSON transition it prints is kept in ``lines`` (with the time it was read)."""

    proc: asyncio.subprocess.Process
    base: str
    guard_url: str
    lines: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    async def read_lines(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and "state" in doc:
                self.lines.append(doc | {"read_t": time.time()})

    async def wait_state(self, state: str, timeout: float, since: float = 0.0) -> dict[str, Any]:
        """The first verdict in ``state`` read after ``since`` (time.time())."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for doc in self.lines:
                if doc["state"] == state and doc["read_t"] >= since:
                    return doc
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no {state} verdict in {timeout:.0f} s: {self.states()}")

    def states(self) -> list[str]:
        return [f"{d['state']}({d['cause']})" for d in self.lines]

    async def metrics(self) -> str:
        async with (
            aiohttp.ClientSession() as s,
            s.get(self.base + "/metrics", timeout=aiohttp.ClientTimeout(5)) as r,
        ):
            return await r.text()


async def start_guard(
    command: str, url: str, *args: str, tail: tuple[str, ...] = (), log: bool = False
) -> GuardProcess:
    """``engine-watchdog guard URL`` (or ``run URL ... -- tail``) with a guard port and a
    watchdog port of its own, JSON transitions on stdout, in its own process group (``log``:
    its log on ``proc.stderr``, else inherited)."""
    listen = f"127.0.0.1:{free_port()}"
    guard = f"127.0.0.1:{free_port()}"
    argv = [command, url, "--json", "--listen", listen, "--guard-listen", guard, "--no-gpu", *args]
    if tail:
        argv += ["--", *tail]
    proc = await asyncio.create_subprocess_exec(
        str(CONSOLE_SCRIPT), *argv, stdout=asyncio.subprocess.PIPE, start_new_session=True,
        stderr=asyncio.subprocess.PIPE if log else None,
    )  # fmt: skip
    started = GuardProcess(proc, f"http://{listen}", f"http://{guard}")
    started.reader = asyncio.create_task(started.read_lines())
    try:
        await wait_listening(started.guard_url, 20.0)
    except BaseException:
        await stop_guard(started)
        raise
    return started


async def stop_guard(guard: GuardProcess) -> None:
    if guard.proc.returncode is None:
        os.killpg(guard.proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(guard.proc.wait(), 10)
        except TimeoutError:
            os.killpg(guard.proc.pid, signal.SIGKILL)
            await guard.proc.wait()
    if guard.reader is not None:
        await asyncio.wait_for(guard.reader, 5)


async def wait_listening(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url + "/metrics", timeout=aiohttp.ClientTimeout(2)):
                    return
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.1)
    raise TimeoutError(f"nothing listens on {url} after {timeout:.0f} s")


@dataclass
class Stream:
    """One streaming request as its client saw it."""

    request_id: str
    status: int = 0
    events: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    """time.time() of each event's arrival."""
    headers: dict[str, str] = field(default_factory=dict)
    ended_t: float | None = None
    body: bytes = b""

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == b"data: [DONE]"

    @property
    def error(self) -> dict[str, Any] | None:
        for event in self.events:
            if event.startswith(b"data: {") and b'"error"' in event[:20]:
                doc: dict[str, Any] = json.loads(event[len(b"data: ") :])["error"]
                return doc
        return None

    @property
    def tokens(self) -> int:
        return sum(1 for e in self.events if b'"choices"' in e)


def completion(model: str, max_tokens: int, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": "The engine served every request until",
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,
        "temperature": 0.0,
        **extra,
    }


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    request_id: str | None = None,
    timeout: float = 120.0,
) -> Stream:
    """POST /v1/completions and keep every SSE event (or the body, when it does not stream)."""
    headers = {"X-Request-Id": request_id} if request_id else {}
    got = Stream(request_id or "")
    async with session.post(
        url + "/v1/completions",
        json=body,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout),
    ) as resp:
        got.status, got.headers = resp.status, dict(resp.headers)
        if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            got.body = await resp.read()
        else:
            async for line in resp.content:
                if line.startswith(b"data:"):
                    got.events.append(line.rstrip(b"\r\n"))
                    got.times.append(time.time())
    got.ended_t = time.time()
    return got


async def admitted_within(
    guard_url: str,
    model: str,
    bound_s: float,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> float | None:
    """Seconds until a request through the guard gets 200 (one at a time), or None."""
    started = time.monotonic()
    async with aiohttp.ClientSession(headers=headers) as session:
        while time.monotonic() - started < bound_s:
            got = await stream(session, guard_url, completion(model, 2), timeout=timeout)
            if got.status == 200 and got.error is None:
                return time.monotonic() - started
            await asyncio.sleep(0.2)  # between attempts only: the bound is the condition
    return None


async def post_json(url: str, body: dict[str, Any], timeout: float = 10.0) -> Any:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, json=body, timeout=aiohttp.ClientTimeout(timeout)) as r,
    ):
        return await r.json()


def normalised(events: list[bytes]) -> list[bytes]:
    """The events with what legitimately differs between two identical requests blanked: the
    creation second and the request id."""
    out = []
    for e in events:
        e = re.sub(rb'"created":\d+', b'"created":0', e)
        out.append(re.sub(rb'"id":"(chat)?cmpl-[^"]*"', b'"id":"-"', e))
    return out


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


@contextlib.asynccontextmanager
async def sse_server() -> AsyncIterator[str]:
    """POST /v1/completions {"events", "size", "interval"}: that many SSE events of that size."""

    async def completions(request: web.Request) -> web.StreamResponse:
        spec = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        event = b'data: {"text":"' + b"x" * int(spec["size"]) + b'"}\n\n'  # a token each
        for _ in range(int(spec["events"])):
            await resp.write(event)
            await asyncio.sleep(float(spec["interval"]))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async with served(completions) as url:
        yield url


@contextlib.asynccontextmanager
async def served(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """An engine on a free loopback port whose POST /v1/completions is ``handler``."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def slow_reader(
    url: str, body: dict[str, Any], pause_s: float, read_s: float = 60.0
) -> bytes:
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
    async with asyncio.timeout(read_s):
        while chunk := await loop.sock_recv(sock, 65536):
            data += chunk
    sock.close()
    return data


@contextlib.asynccontextmanager
async def watched(
    sim: SimProcess, *args: str, command: str = "guard", tail: tuple[str, ...] = ()
) -> AsyncIterator[GuardProcess]:
    guard = await start_guard(command, sim.url, *args, tail=tail)
    try:
        yield guard
    finally:
        await stop_guard(guard)


class Log:
    """A watchdog's log on its stderr pipe (``start_guard(..., log=True)``), read as it comes,
    never blocking on it; read it now and then, or a long run fills the pipe."""

    def __init__(self, guard: GuardProcess) -> None:
        self.proc, self.text = guard.proc, ""

    async def once(self, what: str) -> str | None:
        """The log so far, once it holds ``what``."""
        assert self.proc.stderr is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                while chunk := await self.proc.stderr.read(65536):
                    self.text += chunk.decode(errors="replace")
        return self.text if what in self.text else None
