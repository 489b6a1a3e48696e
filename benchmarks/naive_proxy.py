"""The floor the guard is measured against: a naive aiohttp pass-through (no progress notes, no
detector), as docs/guard.md describes it. ``python -m benchmarks.naive_proxy UPSTREAM PORT``."""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web


async def make_app(upstream: str) -> web.Application:
    session = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(limit=0))

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host",)}
        async with session.request(
            request.method, upstream + request.path_qs, headers=headers, data=body or None
        ) as up:
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main() -> None:
    upstream, port = sys.argv[1], int(sys.argv[2])
    web.run_app(make_app(upstream), host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
