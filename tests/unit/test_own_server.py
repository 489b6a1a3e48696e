"""The watchdog's own endpoints (runtime/endpoints.py), over a real socket: what a Prometheus
scraper and a kubelet ask, and what a client that misbehaves gets (a bounded answer, never a
hang or a crash of the server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from engine_watchdog.runtime.endpoints import HEAD_LIMIT, Server, make_app, start_server


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, int]]:
    registry = CollectorRegistry()
    Counter("probe_rounds", "rounds", registry=registry).inc(3)
    app = make_app(registry, lambda: {"targets": ["t"]}, lambda: (True, "watching"),
                   lambda: (False, "0 probe rounds"))  # fmt: skip
    served = await start_server(app, "127.0.0.1", 0)
    assert served.server is not None
    port = served.server.sockets[0].getsockname()[1]
    yield served, port
    await served.cleanup()


async def ask(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of one request on its own connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    raw = await asyncio.wait_for(reader.read(), 5)  # the server closes after its answer
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


async def test_each_endpoint_answers_and_closes(server: tuple[Server, int]) -> None:
    _, port = server
    code, headers, body = await ask(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert code == 200 and b"probe_rounds_total 3.0" in body
    assert headers["content-type"].startswith("text/plain; version=")
    assert headers["connection"] == "close" and int(headers["content-length"]) == len(body)
    code, headers, body = await ask(port, b"GET /livez HTTP/1.1\r\n\r\n")
    assert (code, json.loads(body)) == (200, {"ok": True, "reason": "watching"})
    assert headers["content-type"] == "application/json; charset=utf-8"
    code, _, body = await ask(port, b"GET /readyz?verbose=1 HTTP/1.0\r\n\r\n")
    assert (code, json.loads(body)) == (503, {"ok": False, "reason": "0 probe rounds"})
    code, _, body = await ask(port, b"GET /status HTTP/1.1\r\n\r\n")
    assert (code, json.loads(body)) == (200, {"targets": ["t"]})


async def test_head_has_the_length_and_no_body(server: tuple[Server, int]) -> None:
    code, headers, body = await ask(server[1], b"HEAD /livez HTTP/1.1\r\n\r\n")
    assert code == 200 and body == b"" and int(headers["content-length"]) > 0


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (b"GET /nope HTTP/1.1\r\n\r\n", 404),
        (b"POST /livez HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"garbage\r\n\r\n", 400),
        (b"GET /livez HTTP/9.9\r\n\r\n", 400),
        (b"GET /livez HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"GET /livez HTTP/1.1\r\nX: " + b"a" * HEAD_LIMIT + b"\r\n\r\n", 431),
    ],
)
async def test_a_bad_request_gets_its_code(
    server: tuple[Server, int], request_: bytes, code: int
) -> None:
    assert (await ask(server[1], request_))[0] == code


async def test_a_handler_that_fails_is_a_500_and_the_server_goes_on() -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("a bug")

    app = make_app(CollectorRegistry(), broken, lambda: (True, ""), lambda: (True, ""))
    served = await start_server(app, "127.0.0.1", 0)
    assert served.server is not None
    port = served.server.sockets[0].getsockname()[1]
    try:
        assert (await ask(port, b"GET /status HTTP/1.1\r\n\r\n"))[0] == 500
        assert (await ask(port, b"GET /livez HTTP/1.1\r\n\r\n"))[0] == 200
    finally:
        await served.cleanup()


async def test_cleanup_ends_a_client_that_never_asks(server: tuple[Server, int]) -> None:
    served, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /li")  # half a request line, then nothing
    await asyncio.sleep(0.1)
    assert len(served.open) == 1
    await asyncio.wait_for(served.cleanup(), 5)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no answer
    writer.close()


async def test_a_taken_port_is_an_oserror(server: tuple[Server, int]) -> None:
    app = make_app(CollectorRegistry(), dict, lambda: (True, ""), lambda: (True, ""))
    with pytest.raises(OSError):
        await start_server(app, "127.0.0.1", server[1])
