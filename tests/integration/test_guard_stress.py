"""The guard's data path under stress (tests/tools/guard_stress.py says what it throws at it):
hundreds of streams of every event-stream shape and fate at once, then the installed guard
stopped by SIGTERM mid-stream, and the installed guard out of file descriptors. No client is
left hanging, every healthy stream is byte-identical, descriptors and memory come back.
``make sanitize`` runs this module under ASan+UBSan and under TSan (fewer streams there)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Callable

import aiohttp
import pytest

from engine_watchdog.core.serving import GuardSettings
from engine_watchdog.guard import scan
from engine_watchdog.guard.answers import DONE
from engine_watchdog.guard.drain import drain
from engine_watchdog.guard.proxy import Guard
from engine_watchdog.sim.launcher import free_port
from tests.tools import guard_stress
from tests.tools.cli import CONSOLE_SCRIPT
from tests.tools.guard import upstream, wait_listening

pytestmark = pytest.mark.timeout(300)
SANITIZED = os.environ.get("ENGINE_WATCHDOG_SANITIZED", "")
CLIENTS = {"": 150, "asan": 60, "tsan": 30}[SANITIZED]
SLOWER = {"": 1, "asan": 2, "tsan": 4}[SANITIZED]
"""How much longer a bound of time is under a sanitizer (what it proves there is memory and
threads; the production build's own run holds the real bound)."""


async def test_hundreds_of_streams_of_every_fate_end_as_they_must_and_leave_nothing() -> None:
    out = await guard_stress.rounds(CLIENTS, 0.0, random.randrange(1_000_000) * 1000, False)
    assert out["problems"] == [], out
    assert out["violations"] == 0, out  # the guard's self-check found nothing
    marks: list[tuple[int, float]] = out["marks"]  # type: ignore[assignment]
    (fds_1, rss_1), (fds_2, rss_2) = marks
    assert fds_2 == fds_1, out["marks"]  # every descriptor back
    if not SANITIZED:  # (a sanitizer holds freed memory back on purpose: its quarantine)
        assert rss_2 - rss_1 < 10.0, out["marks"]  # no growth from one wave to the next
    if scan.COMPILED:
        assert out["relay"][0] > 0, out  # type: ignore[index]  # (the thread did serve)


async def test_a_drain_with_streams_on_the_thread_ends_each_whole_or_with_the_error() -> None:
    """What SIGTERM does to the guard, in this process (so that make sanitize watches the C):
    the drain (1 s) with 60 streams open, many on the relay thread, then the guard stopped,
    its thread with them: every client gets its stream whole, or its prefix then the error
    event; nothing is left open."""
    engine = guard_stress.Engine(pace_s=0.1)
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    seeds = [s for s in range(700_000, 701_000) if guard_stress.fate_of(s) == "whole"][:60]
    guard = Guard(GuardSettings(), upstream(engine.url))
    await guard.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{guard.port}"
    try:
        streams = [asyncio.create_task(stream(url, s)) for s in seeds]
        await until_true(lambda: guard.lanes is None or len(guard.lanes.adopted) >= 10, 30)
        on_thread = 0 if guard.lanes is None else len(guard.lanes.adopted)
        ended = await drain(guard, 1.0)
        await guard.stop()
        bodies = await asyncio.wait_for(asyncio.gather(*streams), 30)
    finally:
        await guard.stop()
        server.close()
    assert not guard.open and ended > 0, (guard.open, ended)
    for seed, body in zip(seeds, bodies, strict=True):
        whole = guard_stress.plan(seed).body
        if body != whole:
            assert body.endswith(DONE) and b"ServiceUnavailableError" in body[-600:], body[-300:]
            assert whole.startswith(body[: body.rfind(b'data: {"error"')].rstrip(b"\n")), seed
    print(f"\n[stress] drain: {on_thread} streams on the thread, {ended} ended")


async def until_true(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def guard_process(
    engine_url: str, *args: str, nofile: int = 0
) -> tuple[asyncio.subprocess.Process, str]:
    """The installed console script's guard, in its own session (``nofile``: its open files
    limit, soft and hard, as ``prlimit`` sets it)."""
    guard = f"127.0.0.1:{free_port()}"
    argv = [str(CONSOLE_SCRIPT), "guard", engine_url, "--guard-listen", guard, "--no-gpu",
            "--listen", f"127.0.0.1:{free_port()}", *args]  # fmt: skip
    if nofile:
        argv = ["prlimit", f"--nofile={nofile}:{nofile}", "--", *argv]
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
    await wait_listening(f"http://{guard}", 30.0)
    return proc, f"http://{guard}"


async def stream(url: str, seed: int) -> bytes:
    """One stream's whole body through the guard (the stress engine's stream ``seed``)."""
    got = b""
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            url + "/v1/completions", json={"stream": True}, headers={"X-Request-Id": str(seed)}
        ) as r,
    ):
        async for piece in r.content.iter_any():
            got += piece
    return got


async def test_sigterm_mid_stream_ends_every_stream_whole_or_with_the_error_event() -> None:
    """SIGTERM with streams open (some on the relay thread): the guard drains (2 s here), then
    ends the rest with the error event; every client gets its stream whole or its prefix then
    the error event, and the process exits 0, within the drain and a bound."""
    engine = guard_stress.Engine(pace_s=0.25)  # 3-40 writes each: most outlast the drain
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    seeds = [s for s in range(900_000, 901_000) if guard_stress.fate_of(s) == "whole"][:60]
    proc, url = await guard_process(engine.url, "--guard-drain-seconds", "2")
    try:
        streams = [asyncio.create_task(stream(url, s)) for s in seeds]
        await asyncio.sleep(0.3)  # under way
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        bodies = await asyncio.wait_for(asyncio.gather(*streams), 30)
        code = await asyncio.wait_for(proc.wait(), 30)
        took = time.monotonic() - signalled
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        server.close()
    assert code == -signal.SIGTERM and took < 15 * SLOWER, (code, took)  # ends by its signal
    assert sum(b != guard_stress.plan(s).body for s, b in zip(seeds, bodies, strict=True)) > 0
    ended = 0
    for seed, body in zip(seeds, bodies, strict=True):
        whole = guard_stress.plan(seed).body
        if body != whole:
            ended += 1
            assert body.endswith(DONE) and b"ServiceUnavailableError" in body[-600:], body[-300:]
            assert whole.startswith(body[: body.rfind(b'data: {"error"')].rstrip(b"\n")), seed
    print(f"\n[stress] SIGTERM: {len(seeds) - ended} streams whole, {ended} ended, {took:.1f} s")


async def test_a_guard_out_of_descriptors_keeps_every_client_answered_then_serves_again() -> None:
    """The installed guard with 64 open files at most and 40 streams at once: what cannot reach
    the engine is answered at once (503, the guard's own limit named), what cannot be accepted
    is closed at once (uvloop's libuv accepts and closes a connection it has no descriptor
    for, so that its loop does not spin: the client sees a reset, never a wait), what the
    thread cannot take stays on the event loop; no client hangs, and once the burst is over a
    stream passes whole."""
    engine = guard_stress.Engine()
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    seeds = [s for s in range(800_000, 801_000) if guard_stress.fate_of(s) == "whole"][:41]
    proc, url = await guard_process(engine.url, nofile=64)
    try:
        burst = await asyncio.wait_for(asyncio.gather(*(outcome(url, s) for s in seeds[:40])), 90)
        after = await asyncio.wait_for(stream(url, seeds[40]), 30)
        assert proc.returncode is None  # it stayed up
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        server.close()
    assert after == guard_stress.plan(seeds[40]).body
    kinds = {k for k, _ in burst}
    assert kinds <= {"whole", "503", "reset"}, burst
    assert all(ok for k, ok in burst if k == "whole")
    assert all("open files" in str(why) for k, why in burst if k == "503"), burst
    counts = {k: sum(1 for kind, _ in burst if kind == k) for k in ("whole", "503", "reset")}
    print(f"\n[stress] 64 descriptors: {counts}")


async def outcome(url: str, seed: int) -> tuple[str, object]:
    try:
        return await _outcome(url, seed)
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        return "reset", repr(exc)


async def _outcome(url: str, seed: int) -> tuple[str, object]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            url + "/v1/completions", json={"stream": True}, headers={"X-Request-Id": str(seed)}
        ) as r,
    ):
        body = await r.read()
        if r.status == 503:
            return "503", body.decode(errors="replace")
        return "whole", body == guard_stress.plan(seed).body
