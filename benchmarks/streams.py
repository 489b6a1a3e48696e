"""Streaming clients that keep up at thousands of streams (benchmarks/scale.py): raw protocols on
uvloop, llhttp (httptools) for the HTTP, spread over processes: 6-13 µs of CPU per event on
the 2-core machine (docs/performance.md), so that 4,096 streams at 50 events/s take a few
client processes a fraction of a core each (their CPU per event and their busiest process's
share of a core are in every row).

Each client sends one streaming request after the other on one keep-alive connection (half of
them /v1/chat/completions), until the phase's window ends. Every event carries its send time
(``"sim_t"``: benchmarks/upstream.c, the simulator's ``--stamp-events``): its latency is its
arrival minus that, kept in a histogram of 0.5 % bins (exact enough for a percentile, and
small to send back from a worker). Also kept: the time from each request to its first event,
the errors (a status that is not 200, an error event, a connection cut mid-stream, a failed
connect), and, in ``freeze`` mode, when each stream's last token and its answer came.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import httptools

BINS_PER_E = 200
"""Histogram bins per factor e of latency (0.5 % wide): bin i holds latencies near e**(i/200) µs."""
N_BINS = int(math.log(1e8) * BINS_PER_E) + 1
"""Up to 100 s."""


@dataclass
class Seen:
    """What one worker's clients saw (merged over workers by :func:`merge`)."""

    events: int = 0
    hist: list[int] = field(default_factory=lambda: [0] * N_BINS)
    first: list[float] = field(default_factory=list)
    """Per request: seconds from sending it to its first event."""
    requests: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    """The worker's CPU time inside the window."""
    busiest_cpu_s: float = 0.0
    """Merged: the busiest worker's CPU time inside the window."""
    frozen: list[tuple[float, float, str]] = field(default_factory=list)
    """freeze mode: per stream, (its last token's arrival, its end, its outcome)."""

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


def add_latency(hist: list[int], seconds: float) -> None:
    us = seconds * 1e6
    hist[min(N_BINS - 1, int(math.log(us) * BINS_PER_E)) if us > 1.0 else 0] += 1


def percentile(hist: list[int], q: float) -> float:
    """Seconds: the q-quantile of a histogram (its bin's middle); nan when empty."""
    total = sum(hist)
    if not total:
        return math.nan
    rank, seen = q * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank and n:
            return math.exp((i + 0.5) / BINS_PER_E) / 1e6
    return math.nan


def request_bytes(port: int, model: str, max_tokens: int, chat: bool) -> bytes:
    if chat:
        path = "/v1/chat/completions"
        body = '{"model":"%s","messages":[{"role":"user","content":"Tell me a long story."}],'
    else:
        path = "/v1/completions"
        body = '{"model":"%s","prompt":"Tell me a long story.",'
    body = (body % model) + f'"max_tokens":{max_tokens},"stream":true,"ignore_eos":true}}'
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return (head + body).encode()


class Client(asyncio.Protocol):
    """One client connection: a streaming request, then the next, until the window ends."""

    def __init__(self, run: Run, request: bytes) -> None:
        self.run, self.request = run, request
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.now = self.sent_t = self.last_t = 0.0
        self.end_t: float | None = None
        self.first = True
        self.rest = b""
        self.status_ok = True
        self.complete = False
        self.outcome = ""
        self.gone = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        self.run.seen.requests += 1
        self.first, self.rest, self.complete = True, b"", False
        self.sent_t = time.time()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.now = time.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.fail("bad-http")

    def on_headers_complete(self) -> None:
        if self.parser.get_status_code() != 200:
            self.status_ok = False

    def on_body(self, body: bytes) -> None:
        if not self.status_ok:
            return
        if self.rest:
            body, self.rest = self.rest + body, b""
        if body.endswith(b"\n\n") and body.count(b"\n\n") == 1:
            self.event(body)  # one event in one chunk, as vLLM writes them
            return
        *events, self.rest = body.split(b"\n\n")
        for one in events:
            self.event(one)

    def event(self, event: bytes) -> None:
        if not event.startswith(b"data: {"):
            return
        now, run = self.now, self.run
        if event.startswith(b'data: {"error"'):
            self.outcome = "error-event"
            if run.freeze_at is not None:
                self.close("error-event")  # the answer: its time is now
            return
        self.last_t = now
        if self.first:
            self.first = False
            run.seen.first.append(now - self.sent_t)
        if run.start <= now <= run.end:
            run.seen.events += 1
            at = event.rfind(b'"sim_t":')
            if at > 0:
                add_latency(run.seen.hist, now - float(event[at + 8 : event.rindex(b"}")]))

    def on_message_complete(self) -> None:
        self.complete = True
        if not self.status_ok:
            self.fail("status")
        elif self.outcome:
            self.fail(self.outcome)
        elif self.run.freeze_at is None and time.time() < self.run.end:
            self.send()  # the next request on the same connection
        else:
            self.close("done")

    def fail(self, kind: str) -> None:
        # In a freeze the error event is the answer awaited, not an error.
        if not self.gone.done() and (self.run.freeze_at is None or kind != "error-event"):
            self.run.seen.error(kind)
        self.close(kind)

    def close(self, outcome: str) -> None:
        self.outcome = self.outcome or outcome
        if self.transport is not None:
            self.transport.close()
        self.ended()

    def ended(self) -> None:
        if not self.gone.done():
            self.end_t = time.time()
            self.gone.set_result(self.outcome)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.gone.done():
            if not self.complete and not self.run.closing:
                self.run.seen.error("cut")
            self.outcome = self.outcome or ("closed" if not self.complete else "done")
            self.ended()


class _Whole:
    """httptools callbacks that keep one whole response."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.done = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


async def fetch(port: int, request: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """One request on a connection of its own: (status, body de-chunked); raises OSError or
    TimeoutError."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    whole = _Whole()
    parser = httptools.HttpResponseParser(whole)

    async def read() -> None:
        while not whole.done:
            data = await reader.read(65536)
            if not data:
                raise ConnectionResetError("closed before the whole response")
            parser.feed_data(data)

    try:
        writer.write(request)
        await asyncio.wait_for(read(), timeout)
        return parser.get_status_code(), b"".join(whole.body)
    finally:
        writer.close()


@dataclass
class Run:
    """One worker's phase."""

    start: float
    end: float
    seen: Seen
    freeze_at: float | None = None
    closing: bool = False


async def _clients(job: dict[str, Any]) -> Seen:
    loop = asyncio.get_running_loop()
    run = Run(job["window"][0], job["window"][1], Seen(), job.get("freeze_at"))
    rng = random.Random(job["seed"])
    length = job["stream_tokens"]
    clients: list[Client] = []

    async def one(i: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.time()))
        tokens = rng.randint(max(1, length // 2), max(1, length * 3 // 2))
        request = request_bytes(job["port"], job["model"], tokens, chat=i % 2 == 1)
        try:
            _, client = await loop.create_connection(
                lambda: Client(run, request), "127.0.0.1", job["port"]
            )
        except OSError:
            run.seen.error("connect")
            return
        clients.append(client)

    n, spread, t0 = job["streams"], job["spread_s"], job["t0"]
    await asyncio.gather(*(one(i, t0 + spread * i / max(1, n)) for i in range(n)))
    await asyncio.sleep(max(0.0, run.start - time.time()))
    cpu0 = time.process_time()
    if run.freeze_at is not None:  # until every stream is answered, or the bound
        await asyncio.wait([c.gone for c in clients], timeout=max(0.0, run.end - time.time()))
        run.seen.frozen = [(c.last_t, c.end_t or math.inf, c.outcome) for c in clients]
    else:
        await asyncio.sleep(max(0.0, run.end - time.time()))
    run.seen.cpu_s = time.process_time() - cpu0
    run.closing = True
    for c in clients:
        c.close("window")
    await asyncio.sleep(0)
    return run.seen


def raise_open_files_limit(wanted: int = 65536) -> None:
    """Thousands of sockets: more than the usual soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def worker(job: dict[str, Any]) -> Seen:
    """One process's share of a phase (a ProcessPoolExecutor job: benchmarks/scale.py)."""
    import uvloop

    raise_open_files_limit()
    if job.get("cpus"):
        os.sched_setaffinity(0, job["cpus"])
    return uvloop.run(_clients(job))


def ready() -> int:
    """Held a moment, so that each of the first jobs starts a worker process of its own."""
    import uvloop  # noqa: F401 (imported before the first phase, not in its window)

    time.sleep(0.3)
    return os.getpid()


def merge(parts: list[Seen]) -> Seen:
    out = Seen()
    for part in parts:
        out.events += part.events
        out.hist = [a + b for a, b in zip(out.hist, part.hist, strict=True)]
        out.first += part.first
        out.requests += part.requests
        out.errors += part.errors
        for kind, n in part.error_kinds.items():
            out.error_kinds[kind] = out.error_kinds.get(kind, 0) + n
        out.cpu_s += part.cpu_s
        out.busiest_cpu_s = max(out.busiest_cpu_s, part.cpu_s)
        out.frozen += part.frozen
    return out
