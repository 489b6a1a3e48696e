"""The peer endpoint: what one node's sidecar answers the leader's, on its own port.

Routes (every one needs ``Authorization: Bearer <the group's secret>``, else 401 and nothing
is done):

- ``GET /v1/node``: this node's rank processes and their state (read-only);
- ``POST /v1/capture``: sample the ranks now (node.py) and answer the capture as JSON
  (codec.py); body ``{"budget_s": N}``, clamped to [1, 120] s;
- ``POST /v1/restart``: stop this node's engine ranks and check the node clean through the
  hook given at construction (peers/node_stop.py); its answer ``{"ok": true, "result": ...}``;
  501 where none was given.

Nothing else is writable. The access log is off (it would print the Authorization header's
neighbours and nothing useful), and no answer or log line names the secret.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from engine_watchdog.core.settings import Secret
from engine_watchdog.peers.auth import authorised
from engine_watchdog.peers.codec import capture_json
from engine_watchdog.peers.node import LocalNode

log = logging.getLogger(__name__)

RestartHook = Callable[[], Awaitable[dict[str, Any]]]
"""Stops this node's engine ranks and checks the node (peers/node_stop.py's NodeRestart);
returns what it did as JSON-able data (raises on failure)."""
MAX_BODY_BYTES = 64 * 1024
MIN_BUDGET_S, MAX_BUDGET_S, DEFAULT_BUDGET_S = 1.0, 120.0, 30.0
UNAUTHORISED = "engine-watchdog peer: missing or wrong Authorization: Bearer (--peer-secret-file)"


def _budget(raw: bytes) -> float:
    try:
        doc = json.loads(raw) if raw.strip() else {}
        value = float(doc.get("budget_s", DEFAULT_BUDGET_S)) if isinstance(doc, dict) else None
    except (ValueError, TypeError):
        value = None
    if value is None or value != value:  # NaN
        raise web.HTTPBadRequest(text='body: {"budget_s": seconds}')
    return min(max(value, MIN_BUDGET_S), MAX_BUDGET_S)


def make_peer_app(
    node: LocalNode, secret: Secret, restart: RestartHook | None = None
) -> web.Application:
    """The peer endpoint's application (see the module docstring)."""
    one_capture = asyncio.Lock()  # two orders at once would ptrace the same ranks twice

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not authorised(request.headers.get("Authorization"), secret):
            log.warning("peer request refused from %s: no valid secret", request.remote)
            return web.json_response({"error": UNAUTHORISED}, status=401)
        return await handler(request)

    async def node_info(_: web.Request) -> web.Response:
        return web.json_response(await node.describe())

    async def capture(request: web.Request) -> web.Response:
        budget = _budget(await request.read())
        async with one_capture:
            cap = await node.capture(budget)
        return web.json_response(capture_json(cap))

    async def restart_ranks(_: web.Request) -> web.Response:
        if restart is None:
            return web.json_response({"error": "no restart on this node"}, status=501)
        try:
            result = await restart()
        except Exception as e:  # the hook's failure is the answer, not a 500 page
            failed = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
            return web.json_response(failed, status=500)
        return web.json_response({"ok": True, "result": result})

    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/v1/node", node_info)
    app.router.add_post("/v1/capture", capture)
    app.router.add_post("/v1/restart", restart_ranks)
    return app


class PeerServer:
    """The endpoint on ``host:port`` (never the engine's port: the caller checks)."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen; OSError when the port is taken (nothing left behind)."""
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self.port == 0:  # tests: the port the kernel chose
            self.port = int(runner.addresses[0][1])

    async def serve(self) -> None:
        """A named task's body: listen until cancelled, then close."""
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
