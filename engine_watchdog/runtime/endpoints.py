"""The watchdog's own HTTP endpoints: /metrics, /livez, /readyz, /status. Read-only.

httptools (llhttp, the guard's parser) reads each request head over asyncio's streams, not
aiohttp's server: every request is a GET of one of four fixed paths, answered at once from
memory, the connection then closed. aiohttp.web
(with argparse, html, its router and protocol) would hold about 2 MB more in a sidecar that runs
for weeks (docs/performance.md, "Footprint of watch"); aiohttp's client stays, for the probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import httptools
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)
StatusFn = Callable[[], dict[str, Any]]
CheckFn = Callable[[], tuple[bool, str]]
Answer = tuple[int, str, bytes]
"""Status code, content type, body."""
App = dict[str, Callable[[], Answer]]
"""Path -> its handler."""
JSON = "application/json; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
HEAD_LIMIT = 8192
"""A request head longer than this is refused (431): no scraper or kubelet sends one."""
HEAD_TIMEOUT_S = 10.0
"""A client that has not sent its request head by then is dropped (it holds a connection)."""
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def make_app(registry: CollectorRegistry, status: StatusFn, live: CheckFn, ready: CheckFn) -> App:
    """``live``/``ready`` return (ok, reason); ``status`` returns a JSON-able snapshot."""

    def metrics() -> Answer:
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

    def probe(check: CheckFn) -> Callable[[], Answer]:
        def handler() -> Answer:
            ok, reason = check()
            return 200 if ok else 503, JSON, json.dumps({"ok": ok, "reason": reason}).encode()

        return handler

    def status_handler() -> Answer:
        return 200, JSON, json.dumps(status()).encode()

    return {
        "/metrics": metrics,
        "/livez": probe(live),
        "/readyz": probe(ready),
        "/status": status_handler,
    }


class Server:
    """The listening socket and the connections it has open, for :meth:`cleanup`."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()

    async def listen(self, host: str, port: int) -> None:
        """On host:port (an OSError when it cannot bind)."""
        self.server = await asyncio.start_server(self.connection, host, port, limit=HEAD_LIMIT)

    async def cleanup(self) -> None:
        """Stop listening and drop every open connection (each is answered at once anyway)."""
        if self.server is not None:
            self.server.close()
        for writer in list(self.open):
            writer.close()
        if self.server is not None:
            await self.server.wait_closed()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open.add(writer)
        try:
            answer = await self._answer(reader)
            if answer is not None:
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass  # the client went away or never asked: nothing to answer
        finally:
            self.open.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> bytes | None:
        head = await asyncio.wait_for(read_head(reader), HEAD_TIMEOUT_S)
        if isinstance(head, int):
            return response(head, TEXT, f"{head}: {REASONS[head]}".encode(), head=False)
        method, target = head
        handler = self.app.get(target)
        if handler is None:
            return response(404, TEXT, b"404: Not Found", method == b"HEAD")
        if method not in (b"GET", b"HEAD"):
            return response(405, TEXT, b"405: Method Not Allowed", False, b"Allow: GET, HEAD\r\n")
        try:
            code, content_type, body = handler()
        except Exception:  # a bug in one answer: a 500 and its traceback, the server goes on
            log.exception("GET %s failed", target)
            code, content_type, body = 500, TEXT, b"500: Internal Server Error"
        return response(code, content_type, body, method == b"HEAD")


class Head:
    """httptools' callbacks for one request head: its target, and whether it is whole."""

    def __init__(self) -> None:
        self.url = b""
        self.whole = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_headers_complete(self) -> None:
        self.whole = True


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, str] | int:
    """The request's method and path, or the status that refuses it (400, 431)."""
    head, size = Head(), 0
    parser = httptools.HttpRequestParser(head)
    while not head.whole:
        data = await reader.read(HEAD_LIMIT)
        if not data:
            raise asyncio.IncompleteReadError(b"", None)
        size += len(data)
        try:
            parser.feed_data(data)
            path = httptools.parse_url(head.url).path if head.whole else b""
        except httptools.HttpParserError:  # (an upgrade or a bad URL is one too)
            return 400
        if size > HEAD_LIMIT:
            return 431
    return parser.get_method(), path.decode("latin-1")


def response(code: int, content_type: str, body: bytes, head: bool, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer that closes the connection (``head``: without its body)."""
    lines = (
        f"HTTP/1.1 {code} {REASONS[code]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode("latin-1")
    return lines + extra + b"\r\n" + (b"" if head else body)


async def start_server(app: App, host: str, port: int) -> Server:
    """Listening on host:port (an OSError when it cannot bind, nothing left behind)."""
    served = Server(app)
    await served.listen(host, port)
    return served
