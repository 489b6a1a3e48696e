"""The guard's compiled read callback (guard/_side.c) against its Python one (guard/side.py):
the same reads of the same stream give the same writes to the client, the same counts, times
and histograms, and the same ends (a client gone, a full client buffer, a parse error)."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_watchdog.guard import side
from engine_watchdog.guard.exchange import Exchange
from engine_watchdog.guard.fast import Client, EngineSide
from engine_watchdog.guard.stats import GuardStats

PyEngineSide: Any = type(
    "PyEngineSide",
    (side.PySide, asyncio.Protocol),
    {k: v for k, v in vars(EngineSide).items() if k not in ("__dict__", "__weakref__")},
)
"""EngineSide on the Python callback, whichever the package runs."""
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
HIGH = 65536


class Transport:
    """Both ends' transport: records the writes; closing and buffer size as the test says."""

    def __init__(self, closes_at: int | None, sizes: list[int]) -> None:
        self.writes: list[bytes] = []
        self.calls = 0
        self.closes_at = closes_at
        self.sizes = itertools.cycle(sizes or [0])
        self.paused = 0

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        self.calls += 1
        return self.closes_at is not None and len(self.writes) >= self.closes_at

    def get_write_buffer_size(self) -> int:
        return next(self.sizes)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (HIGH // 4, HIGH)

    def pause_reading(self) -> None:
        self.paused += 1

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def event(kind: str, text: str) -> bytes:
    token = json.dumps(text)
    return {
        "text": b'data: {"id":"cmpl-7","choices":[{"index":0,"text":%b}]}\n\n',
        "chat": b'data: {"id":"chatcmpl-7","choices":[{"delta":{"content":%b}}]}\n\n',
        "role": b'data: {"choices":[{"delta":{"role":"assistant"}}],"x":%b}\n\n',
        "keepalive": b": keepalive %b\n\n",
        "lines": b'event: delta\ndata: {"text":%b}\n\n',
        "done": b"data: [DONE]%b\n\n",
    }[kind] % token.encode()


def chunked(events: list[bytes], cuts: list[int] | None) -> list[bytes]:
    """The body's chunks: one per event (vLLM's), or cut where ``cuts`` say."""
    if cuts is None:
        return [b"%x\r\n%b\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]
    body, pieces = b"".join(events), []
    for a, b in itertools.pairwise([0, *sorted({c % (len(body) + 1) for c in cuts}), len(body)]):
        if b > a:
            pieces.append(b"%x\r\n%b\r\n" % (b - a, body[a:b]))
    return [*pieces, b"0\r\n\r\n"]


def reads(chunks: list[bytes], cuts: list[int] | None) -> Iterator[bytes]:
    """The engine's reads: one per chunk (each write read at once), or cut where ``cuts`` say."""
    if cuts is None:
        yield from chunks
        return
    data = b"".join(chunks)
    for a, b in itertools.pairwise([0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]):
        if b > a:
            yield data[a:b]


def relaying(cls: Any, engine: Any, client: Any, clock: Any) -> tuple[Any, Exchange, GuardStats]:
    """An engine side of ``cls`` past the response head, relaying an SSE stream to ``client``
    (as EngineSide.relay starts it). Call from a running loop."""
    up = cls("POST")
    up.connection_made(engine)
    up.data_received(HEAD)
    ex, stats = Exchange("k", "", 0.0), GuardStats()
    ex.sse = True
    up._client = Client(client, ex, stats, True, clock)
    return up, ex, stats


def replay(cls: Any, data: list[bytes], closes_at: int | None, sizes: list[int]) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        engine, client, clock = Transport(None, []), Transport(closes_at, sizes), itertools.count(1)
        up, ex, stats = relaying(cls, engine, client, lambda: float(next(clock)))
        after_each = []
        for read in data:
            up.data_received(read)
            after_each.append((ex.events, ex.last_event_t, ex.waiting_since, stats.events))
        g, f = stats.gaps, stats.first_event
        return {
            "writes": client.writes,
            "after each read": after_each,
            "closing checks": client.calls > 0,
            "engine paused": engine.paused,
            "failure": repr(up.failure),
            "done": up.done,
            "stats": (stats.events, stats.last_event_t, g.counts, g.total, f.counts, f.total),
            "ex": (ex.events, ex.first_event_t, ex.last_event_t, ex.waiting_since, ex.engine_id),
            "scan": (ex.scan.pending, ex.scan.key),
        }

    return asyncio.run(run())


kinds = st.sampled_from(["text", "text", "text", "chat", "role", "keepalive", "lines", "done"])
tokens = st.text(max_size=6) | st.just("")
streams = st.lists(st.tuples(kinds, tokens), min_size=1, max_size=25)
cuts = st.none() | st.lists(st.integers(min_value=0, max_value=4000), max_size=12)


@pytest.mark.skipif(not side.COMPILED, reason="the compiled callback is not built here")
@settings(max_examples=300, deadline=None)
@given(
    streams,
    cuts,
    cuts,
    st.none() | st.integers(0, 20),
    st.lists(st.sampled_from([0, 0, 0, HIGH + 1]), max_size=4),
)
def test_the_compiled_callback_does_what_the_python_one_does(
    stream: list[tuple[str, str]],
    chunk_cuts: list[int] | None,
    read_cuts: list[int] | None,
    closes_at: int | None,
    sizes: list[int],
) -> None:
    events = [event(kind, text) for kind, text in stream]
    data = list(reads(chunked(events, chunk_cuts), read_cuts))
    compiled = replay(EngineSide, data, closes_at, sizes)
    python = replay(PyEngineSide, data, closes_at, sizes)
    assert compiled == python


@pytest.mark.skipif(not side.COMPILED, reason="the compiled callback is not built here")
def test_a_bad_response_ends_the_same_way_in_both() -> None:
    bad = [b"5\r\nhello\r\nZZ\r\n"]
    assert replay(EngineSide, bad, None, []) == replay(PyEngineSide, bad, None, [])
    assert "not HTTP/1.1 the guard passes" in replay(EngineSide, bad, None, [])["failure"]


@pytest.mark.skipif(not side.COMPILED, reason="the compiled callback is not built here")
def test_the_steady_path_keeps_no_memory_per_event() -> None:
    one = event("text", " the")
    frame = b"%x\r\n%b\r\n" % (len(one), one)

    async def run() -> int:
        sink: Any = Transport(None, [])
        sink.write = lambda data: None  # (nothing kept: only the path's own memory is counted)
        clock = itertools.count(1.0, 0.25).__next__
        up, ex, _ = relaying(EngineSide, Transport(None, []), sink, clock)
        for _ in range(2000):  # warm: counters past the small-int cache, freelists filled
            up.data_received(frame)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20000):
            up.data_received(frame)
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert ex.events == 22000
        return grown

    assert asyncio.run(run()) < 16384  # a leaked object per event would be 20,000 of them


def test_the_dev_install_runs_the_compiled_callback() -> None:
    """`make test` builds the package with a C compiler: the suite runs the compiled path."""
    if os.environ.get(side.PURE_ENV, "") not in ("", "0"):
        pytest.skip(f"{side.PURE_ENV} is set")
    assert side.COMPILED, "guard/_side.c was not built: pip install -e . with a C compiler"
    assert importlib.util.find_spec("engine_watchdog.guard._lane"), "guard/_lane.c was not built"
