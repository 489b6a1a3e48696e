"""A stress of the guard's data path: many streams at once through a real :class:`Guard` on
loopback, each of a shape and a fate drawn from its seed, every byte each client got compared
with what the engine sent it (tests/integration/test_guard_stress.py runs it briefly; ``make
sanitize`` runs that under each sanitizer). By hand, for a long hunt:

    .venv/bin/python -m tests.tools.guard_stress --clients 200 --seconds 1800 [--loop asyncio]

The engine (an asyncio server answering raw HTTP/1.1, chunked as uvicorn answers) writes each
stream in an event-stream shape (LF, CRLF, CR, ``data:`` with and without its space, comments
and other fields), with vLLM-sized events and, now and then, 8-30 KB and 200 KB ones, cut into
chunks anywhere and written in bursts or paced. Each stream's fate:

- ``whole``: to its end; the client must get exactly the engine's bytes;
- ``slow``: its client stops reading for a while (the guard's buffer fills, the engine is held
  back), then reads on; exactly the engine's bytes;
- ``reset``: the engine resets the connection inside an event; the client gets a prefix of the
  engine's bytes, then the cut;
- ``leave``: the client leaves mid-stream; the engine must see its connection closed;
- ``silent``: the engine stops and holds the connection; the harness, as the request judge
  would, ends it: the client gets the prefix, then the error event and ``[DONE]``.

Every request must end within a bound (none hangs), the guard's self-check (guard/held.py) must
find nothing, and after each round the guard holds no request, its descriptors are back to
where they were and its memory does not grow. A request over the bound is reported with the
guard's state for it (guard/held.py ``describe``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from engine_watchdog.core.serving import GuardSettings
from engine_watchdog.guard.answers import DONE
from engine_watchdog.guard.held import describe
from engine_watchdog.guard.proxy import Guard
from tests.tools.guard import upstream

FATES = ("whole", "whole", "whole", "slow", "reset", "leave", "silent")
BOUND_S = 60.0
"""No request may take longer than this (the slowest fate pauses a few seconds)."""
ENDED = "stress: ended as the judge would"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


@dataclass
class Plan:
    """One stream, from its seed: what the engine writes and how it ends."""

    seed: int
    fate: str
    writes: list[tuple[bytes, int, float]]
    """(framed bytes, body bytes in them, pause after) in order; the last ends the body."""
    body: bytes
    """The response body the engine sends in full (the client's expectation)."""
    stop: int
    """reset and silent: the engine writes ``writes[:stop]`` whole (then cuts or goes silent)."""

    @property
    def prefix(self) -> int:
        """Body bytes in ``writes[:stop]``."""
        return sum(n for _, n, _ in self.writes[: self.stop])


def event(rng: random.Random, i: int, seed: int, eol: bytes, space: bool) -> bytes:
    size = rng.choices([12, 20_000, 200_000], weights=[90, 9, 1])[0]
    text = "".join(rng.choice("abcdefghij ") for _ in range(rng.randrange(1, size)))
    if rng.random() < 0.5:
        doc = {"id": f"cmpl-{seed}", "object": "text_completion", "created": 1765000000 + i,
               "model": "tiny", "choices": [{"index": 0, "text": text, "logprobs": None,
                                             "finish_reason": None}]}  # fmt: skip
    else:
        doc = {"id": f"chatcmpl-{seed}", "object": "chat.completion.chunk", "model": "tiny",
               "choices": [{"index": 0, "delta": {"content": text}}]}  # fmt: skip
    lead = b"data: " if space else b"data:"
    extra = b": keepalive" + eol if rng.random() < 0.05 else b""
    extra += b"event: delta" + eol if rng.random() < 0.05 else b""
    return extra + lead + json.dumps(doc, separators=(",", ":")).encode() + eol + eol


def fate_of(seed: int) -> str:
    """The fate of stream ``seed`` (what :func:`plan` draws first)."""
    return random.Random(seed).choice(FATES)


def plan(seed: int) -> Plan:
    """Stream ``seed``'s plan (the engine, its client and the check each make it again: a cache
    would hold every stream's bytes, and the test reads the harness's memory too)."""
    rng = random.Random(seed)
    fate = rng.choice(FATES)
    eol = rng.choice([b"\n", b"\r\n", b"\r"])
    space = rng.random() < 0.8
    events = [event(rng, i, seed, eol, space) for i in range(rng.randrange(3, 40))]
    body = b"".join(events) + b"data: [DONE]" + eol + eol
    chunks, at = [], 0
    while at < len(body):  # chunks cut anywhere: mostly an event each, as uvicorn writes
        n = rng.choice([len(events[0]), rng.randrange(1, 600), rng.randrange(1, 70_000)])
        chunks.append(body[at : at + n])
        at += n
    writes: list[tuple[bytes, int, float]] = []
    for piece in chunks:
        framed = b"%x\r\n%b\r\n" % (len(piece), piece)
        if writes and rng.random() < 0.3:  # a burst: two chunks in one write
            joined, n, pause = writes.pop()
            writes.append((joined + framed, n + len(piece), pause))
        else:
            writes.append((framed, len(piece), rng.choice([0.0, 0.001, 0.005, 0.02])))
    writes.append((b"0\r\n\r\n", 0, 0.0))
    stop = rng.randrange(1, len(writes) - 1) if len(writes) > 2 else 1
    return Plan(seed, fate, writes, body, stop if fate in ("reset", "silent") else len(writes))


@dataclass
class Engine:
    pace_s: float = 0.0
    """A pause after every write, beside the stream's own (streams that last)."""
    url: str = ""
    closed_by_guard: set[int] = field(default_factory=set)
    """Seeds whose connection the guard closed while the engine held it (leave, silent)."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        p: Plan | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            fields = {k.lower(): v for k, v in fields.items()}
            await reader.readexactly(int(fields.get("content-length", "0")))
            if "x-request-id" not in fields:  # a watchdog's probe (/metrics): no engine here
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                return
            p = plan(int(fields["x-request-id"]))
            writer.write(SSE_HEAD)
            await self._write(p, writer)
            if p.fate in ("leave", "silent"):
                async with asyncio.timeout(BOUND_S):
                    await reader.read()  # b"": the guard closed its side
                self.closed_by_guard.add(p.seed)
        except (ConnectionError, RuntimeError, asyncio.IncompleteReadError):  # (uvloop: Runtime)
            if p is not None and p.fate == "leave":
                self.closed_by_guard.add(p.seed)  # (while it still wrote)
        except TimeoutError:
            pass
        finally:
            writer.close()

    async def _write(self, p: Plan, writer: asyncio.StreamWriter) -> None:
        sent = 0  # body bytes sent so far
        for i, (framed, n, pause) in enumerate(p.writes):
            if i == p.stop:
                if p.fate == "reset":  # a part of this write, then the reset
                    writer.write(framed[: max(1, len(framed) // 2)])
                    await writer.drain()
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return  # (silent: nothing more, the connection held)
            writer.write(framed)
            await writer.drain()
            sent += n
            if pause or self.pace_s:
                await asyncio.sleep(pause + self.pace_s)
            if p.fate == "leave" and sent > len(p.body) // 2:
                await asyncio.sleep(0.05)  # hold on: the client leaves meanwhile


@dataclass
class Result:
    streams: int = 0
    bytes_compared: int = 0
    fates: Counter[str] = field(default_factory=Counter)
    slowest_s: float = 0.0
    problems: list[str] = field(default_factory=list)


async def client(
    session: aiohttp.ClientSession, url: str, seed: int, guard: Guard, engine: Engine, r: Result
) -> None:
    p = plan(seed)
    rng = random.Random(seed ^ 0x5EED)
    started = time.monotonic()
    got = b""
    error: BaseException | None = None
    try:
        async with asyncio.timeout(BOUND_S):
            got, error = await _read(session, url, p, rng, guard, engine)
    except TimeoutError:
        state = [describe(ex, time.time()) for ex in guard.open.values() if ex.label == str(seed)]
        r.problems.append(f"{seed} ({p.fate}): no end in {BOUND_S:.0f} s; {state}")
        return
    took = time.monotonic() - started
    r.slowest_s = max(r.slowest_s, took)
    r.streams += 1
    r.fates[p.fate] += 1
    r.bytes_compared += len(got)
    if p.fate == "leave":  # the guard closes the engine's connection: wait for the engine to see it
        for _ in range(1000):
            if p.seed in engine.closed_by_guard:
                break
            await asyncio.sleep(0.01)
    why = _check(p, got, error, engine)
    if why:
        r.problems.append(f"{seed} ({p.fate}): {why}")


async def _read(
    session: aiohttp.ClientSession,
    url: str,
    p: Plan,
    rng: random.Random,
    guard: Guard,
    engine: Engine,
) -> tuple[bytes, BaseException | None]:
    got = b""
    headers = {"X-Request-Id": str(p.seed)}
    body = {"model": "tiny", "prompt": "go", "stream": True}
    pause_at = rng.randrange(1, max(2, len(p.body))) if p.fate == "slow" else -1
    leave_at = max(1, len(p.body) // 2) if p.fate == "leave" else -1
    try:
        async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
            async for piece in resp.content.iter_chunked(1 << 16):
                got += piece
                if 0 <= pause_at <= len(got):
                    pause_at = -1
                    await asyncio.sleep(rng.uniform(0.3, 1.5))  # reads nothing meanwhile
                if 0 <= leave_at <= len(got):
                    resp.close()  # the client goes away mid-stream
                    return got, None
                if p.fate == "silent" and len(got) >= p.prefix:  # all the engine will send
                    _end_as_judge(guard, p.seed)
    except (aiohttp.ClientError, ConnectionError) as exc:
        return got, exc
    return got, None


def _end_as_judge(guard: Guard, seed: int) -> None:
    for key, ex in list(guard.open.items()):
        if ex.label == str(seed) and ex.ending is None:
            guard.end(key, ENDED)


def _check(p: Plan, got: bytes, error: BaseException | None, engine: Engine) -> str | None:
    if p.fate in ("whole", "slow"):
        if got != p.body:
            return f"body differs: {len(got)} bytes, {len(p.body)} sent ({error!r})"
    elif p.fate == "reset":
        if not p.body.startswith(got) or len(got) > p.prefix + p.writes[p.stop][1]:
            return f"not a prefix of what was sent before the cut ({len(got)} bytes)"
    elif p.fate == "silent":
        tail = got[p.prefix :]
        if (
            got[: p.prefix] != p.body[: p.prefix]
            or not tail.endswith(DONE)
            or ENDED.encode() not in tail
        ):
            return f"not the prefix then the error event: ...{got[-200:]!r}"
    elif p.fate == "leave" and p.seed not in engine.closed_by_guard:
        return "the engine never saw its connection closed"
    return None


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


async def rounds(clients: int, seconds: float, seed0: int, report: bool) -> dict[str, object]:
    """Waves of ``clients`` concurrent streams until ``seconds`` have passed (at least two)."""
    engine = Engine()
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    guard = Guard(GuardSettings(held_limit_s=5.0), upstream(engine.url))
    await guard.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{guard.port}"
    probing = asyncio.create_task(_probe_rounds(guard))
    r, marks, seed, wave, reported = Result(), [], seed0, 0, 0
    deadline = time.monotonic() + seconds
    try:
        while wave < 2 or time.monotonic() < deadline:
            connector = aiohttp.TCPConnector(limit=0)  # keep-alive: connections reused
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=BOUND_S)  # (the bound's)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                await asyncio.gather(
                    *(client(session, url, seed + i, guard, engine, r) for i in range(clients))
                )
            seed += clients
            wave += 1
            await _settle(guard)
            gc.collect()
            marks.append((fds(), rss_mb()))
            if report:
                for problem in r.problems[reported:]:
                    print(f"[stress] problem: {problem}", flush=True)
                reported = len(r.problems)
                print(f"[stress] wave {wave}: {r.streams} streams, {r.bytes_compared} bytes, "
                      f"fds {marks[-1][0]}, rss {marks[-1][1]:.1f} MB, problems "
                      f"{len(r.problems)}", flush=True)  # fmt: skip
    finally:
        probing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probing
        relay = guard.lanes.pump.counts() if guard.lanes is not None else None
        await guard.stop()
        server.close()
        await server.wait_closed()
    return {
        "streams": r.streams,
        "bytes": r.bytes_compared,
        "fates": dict(r.fates),
        "slowest_s": round(r.slowest_s, 2),
        "problems": r.problems,
        "violations": guard.stats.violations,
        "marks": marks,
        "relay": relay,
    }


async def _probe_rounds(guard: Guard) -> None:
    """What the watchdog's probe rounds do with the guard: a snapshot a second (the relay's
    counts synced, the self-check run)."""
    while True:
        await asyncio.sleep(1.0)
        guard.snapshot(time.time())


async def _settle(guard: Guard) -> None:
    for _ in range(500):
        if not guard.open:
            return
        await asyncio.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description="The guard's data path under stress.")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 1_000_000 * 1000)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    started = time.monotonic()
    out = asyncio.run(rounds(args.clients, args.seconds, args.seed, report=True))
    out["seconds"] = round(time.monotonic() - started)
    print(json.dumps(out))
    sys.exit(1 if out["problems"] or out["violations"] else 0)


if __name__ == "__main__":
    main()
