"""The watchdog's own HTTP endpoints: /metrics, /livez, /readyz, /status. Read-only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

StatusFn = Callable[[], dict[str, Any]]
CheckFn = Callable[[], tuple[bool, str]]


def make_app(
    registry: CollectorRegistry, status: StatusFn, live: CheckFn, ready: CheckFn
) -> web.Application:
    """``live``/``ready`` return (ok, reason); ``status`` returns a JSON-able snapshot."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def probe(check: CheckFn) -> Callable[[web.Request], Any]:
        async def handler(_: web.Request) -> web.Response:
            ok, reason = check()
            return web.json_response({"ok": ok, "reason": reason}, status=200 if ok else 503)

        return handler

    async def status_handler(_: web.Request) -> web.Response:
        return web.json_response(status())

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/livez", probe(live))
    app.router.add_get("/readyz", probe(ready))
    app.router.add_get("/status", status_handler)
    return app


async def start_server(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Listening on host:port (an OSError when it cannot bind, nothing left behind)."""
    # Its handlers answer at once: aiohttp's 60 s wait for them at cleanup would only ever
    # wait on a client that does not read.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
