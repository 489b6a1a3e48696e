"""The benchmark upstream (benchmarks/upstream.c) is what benchmarks/scale.py claims it is: a
stream from it has the bytes of a real vLLM's (tests/data/vllm/stream-*.http, recorded from vLLM
0.32 through uvicorn: the head, one chunk per event, the same JSON keys in the same order, the
same fixed values), each event stamped with its send time; its pace and length knobs hold, and a
freeze stops every stream and the counters while /health still answers."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks import streams, upstream

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm"
STAMP = "sim_t"
"""The upstream's one addition to vLLM's events (the simulator's --stamp-events key)."""
FIXED = (
    *("object", "index", "logprobs", "finish_reason", "stop_reason", "system_fingerprint"),
    *("prompt_token_ids", "prompt_text", "token_ids", "role"),
)
"""Keys whose values vLLM's events carry fixed (or null): equal to the recorded ones."""


@pytest.fixture
async def up() -> AsyncIterator[upstream.Upstream]:
    async with upstream.running(procs=2, rate=200.0) as started:
        yield started


def split_wire(raw: bytes) -> tuple[list[str], list[bytes]]:
    """(the head's lines, the chunks' payloads), checking every size line against its chunk."""
    head, _, body = raw.partition(b"\r\n\r\n")
    chunks = []
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        assert size == f"{n:x}".encode(), size  # lowercase hex, as uvicorn writes it
        if n == 0:
            assert rest == b"\r\n", rest
            break
        assert rest[n : n + 2] == b"\r\n"
        chunks.append(rest[:n])
        body = rest[n + 2 :]
    return head.decode().split("\r\n"), chunks


def shape(value: Any, path: str = "") -> list[tuple[str, str, Any]]:
    """Every key in order, its value's type, and the value where vLLM's is fixed."""
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            # The content of the role chunk is fixed (""); the tiny model's other empty contents
            # are bytes it has not decoded yet: text like any other.
            fixed = item if key in FIXED or (key == "content" and "role" in value) else None
            out.append((f"{path}.{key}", type(item).__name__, fixed))
            out += shape(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            out += shape(item, f"{path}[]")
    return out


async def stream(port: int, path: str, max_tokens: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": "tiny", "prompt": "p", "max_tokens": max_tokens, "stream": True})
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    got = b""
    try:
        while not got.endswith(b"\r\n0\r\n\r\n"):
            piece = await asyncio.wait_for(reader.read(65536), 10)
            assert piece, got
            got += piece
    finally:
        writer.close()
    return got


@pytest.mark.parametrize(
    ("recorded", "path"),
    [("stream-completions.http", "/v1/completions"), ("stream-chat.http", "/v1/chat/completions")],
)
async def test_a_stream_has_the_bytes_of_a_real_vllm_stream(
    up: upstream.Upstream, recorded: str, path: str
) -> None:
    real_head, real = split_wire((DATA / recorded).read_bytes())
    t0 = time.time()
    head, mine = split_wire(await stream(up.port, path, 6))
    arrived = time.time()
    assert [h.split(":")[0] for h in head] == [h.split(":")[0] for h in real_head]
    assert [h for h in head if not h.startswith("date:")] == [
        h for h in real_head if not h.startswith("date:")
    ]
    assert mine[-1] == real[-1] == b"data: [DONE]\n\n"
    assert len(mine) == len(real)
    for ours, theirs in zip(mine[:-1], real[:-1], strict=True):
        assert ours.startswith(b"data: {") and ours.endswith(b"}\n\n"), ours  # one event a chunk
        doc, want = json.loads(ours[6:]), json.loads(theirs[6:])
        assert t0 <= doc.pop(STAMP) <= arrived  # stamped when sent
        assert shape(doc) == shape(want), (ours, theirs)
        assert re.fullmatch(r"(chat)?cmpl-[0-9a-f]{16}", doc["id"]), doc["id"]
        assert doc["model"] == upstream.MODEL
        assert 250 <= len(ours) <= 400, len(ours)  # a real deployment's event size


async def test_the_pace_and_the_length_knobs_hold(up: upstream.Upstream) -> None:
    async def gaps(n_streams: int, events: int) -> tuple[list[float], list[int]]:
        """Mean gap between events per stream, and each stream's event count."""

        async def one() -> tuple[float, int]:
            reader, writer = await asyncio.open_connection("127.0.0.1", up.port)
            writer.write(streams.request_bytes(up.port, "m", events, chat=False))
            times: list[float] = []
            while True:
                line = await asyncio.wait_for(reader.readline(), 10)
                if line.startswith(b"data: {"):
                    times.append(time.monotonic())
                if line.startswith(b"data: [DONE]"):
                    writer.close()
                    return (times[-1] - times[0]) / (len(times) - 1), len(times)

        done = await asyncio.gather(*(one() for _ in range(n_streams)))
        return [g for g, _ in done], [n for _, n in done]

    fast, counts = await gaps(20, 41)
    assert counts == [41] * 20
    assert all(g > 0.00475 for g in fast), fast  # 200 events/s: 5 ms apart, never less
    await up.config(50.0, stream_tokens=21)
    slow, counts = await gaps(20, 100)
    assert counts == [21] * 20  # the length knob over the request's max_tokens
    assert all(g > 0.019 for g in slow), slow  # 50 events/s: 20 ms apart, never less
    # the pace knob, whatever else the machine runs (a loaded one stretches every gap alike):
    # a quarter of the rate, four times the gap
    ratio = statistics.median(slow) / statistics.median(fast)
    assert 3.2 < ratio < 4.8, (ratio, fast, slow)


def metric(body: bytes, name: str) -> float:
    found = re.search(rb"^" + re.escape(name.encode()) + rb"\{[^}]*\} (\S+)$", body, re.M)
    assert found, body
    return float(found.group(1))


async def test_a_freeze_stops_every_stream_and_the_counters_while_health_answers(
    up: upstream.Upstream,
) -> None:
    request = streams.request_bytes(up.port, "m", 10**6, chat=True)
    opened = [await asyncio.open_connection("127.0.0.1", up.port) for _ in range(8)]
    for _, writer in opened:
        writer.write(request)
    for reader, _ in opened:
        await asyncio.wait_for(reader.readuntil(b"data: {"), 10)
    await up.freeze()
    deadline = time.monotonic() + 2.0
    for reader, _ in opened:  # what was under way when it froze
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(reader.read(65536), 0.05)
            except TimeoutError:
                break
    scrape = (await streams.fetch(up.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))[1]
    assert metric(scrape, "vllm:num_requests_running") == 8
    await asyncio.sleep(0.5)
    for reader, _ in opened:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(65536), 0.05)  # not one byte in 0.5 s
    health = await streams.fetch(up.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    again = (await streams.fetch(up.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))[1]
    assert health[0] == 200
    tokens = "vllm:generation_tokens_total"
    assert metric(again, tokens) == metric(scrape, tokens)
    await up.thaw()
    for reader, _ in opened:
        await asyncio.wait_for(reader.readuntil(b"data: {"), 2)  # moving again
    for _, writer in opened:
        writer.close()
