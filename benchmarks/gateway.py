"""A small gateway that keeps silent SSE streams "alive" with comments (benchmarks/timers.py).

Gateways and proxies in front of engines send ``: keepalive`` SSE comments while a stream is
silent, so that idle timers downstream do not cut it (LiteLLM PR #34821 added them for this).
This one passes every request to its upstream as it is and, on an SSE response, writes
``: keepalive`` each time the upstream has been silent for ``keepalive_s``. A stream whose
tokens stopped then never looks idle to a byte timer (nginx ``proxy_read_timeout``): only a
proxy that counts tokens (engine_watchdog/guard/tokens.py) sees that nothing is generated.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from engine_watchdog.sim.launcher import free_port

KEEPALIVE = b": keepalive\n\n"
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "host"}
)


class Gateway:
    """Everything passed to ``upstream``; SSE streams get a comment per ``keepalive_s`` of
    upstream silence. ``keepalives`` counts the comments written."""

    def __init__(self, upstream: str, keepalive_s: float) -> None:
        self.upstream = upstream
        self.keepalive_s = keepalive_s
        self.keepalives = 0
        self.session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        async with self.session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            resp = web.StreamResponse(status=upstream.status, headers=out_headers)
            await resp.prepare(request)
            sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            await (self._relay_sse(upstream, resp) if sse else self._relay(upstream, resp))
            await resp.write_eof()
            return resp

    async def _relay(self, upstream: aiohttp.ClientResponse, resp: web.StreamResponse) -> None:
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)

    async def _relay_sse(self, upstream: aiohttp.ClientResponse, resp: web.StreamResponse) -> None:
        # One read in flight, never cancelled by the keepalive timer (a cancelled read could
        # lose bytes): the timer only decides whether a comment goes out meanwhile.
        read: asyncio.Task[bytes] | None = None
        try:
            while True:
                read = read or asyncio.ensure_future(upstream.content.readany())
                done, _ = await asyncio.wait({read}, timeout=self.keepalive_s)
                if not done:
                    await resp.write(KEEPALIVE)
                    self.keepalives += 1
                    continue
                chunk, read = read.result(), None
                if not chunk:
                    return
                await resp.write(chunk)
        finally:
            if read is not None:
                read.cancel()


@contextlib.asynccontextmanager
async def serving(upstream: str, keepalive_s: float) -> AsyncIterator[tuple[str, Gateway]]:
    """The gateway on a free loopback port: its URL and itself."""
    gateway = Gateway(upstream, keepalive_s)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, auto_decompress=False
    ) as session:
        gateway.session = session
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", gateway.handle)
        # A client that leaves cancels its handler, which closes the upstream stream (the
        # engine aborts the request), as a real gateway does.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            yield f"http://127.0.0.1:{port}", gateway
        finally:
            await runner.cleanup()
