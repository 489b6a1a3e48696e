"""A REAL loopback aiohttp engine for the guard's token tests: each
POST /v1/completions says in its body what its stream does, and the engine keeps what became
of every stream by the body's ``tag`` (finished, or cut from the guard's side: an abort).

- ``{"mode": "moving", "events": N}``: N token events 0.1 s apart, cycling through every
  shape that carries tokens (completions ``text``, chat ``delta.content``,
  ``reasoning_content``, tool-call ``arguments``), then ``[DONE]``;
- ``{"mode": "keepalive"}``: one token, then only ``: keepalive`` comments every 0.3 s;
- ``{"mode": "empty"}``: one token, then only chunks without one (empty deltas, role-only,
  usage-only, empty text) every 0.3 s.

The endless modes are bounded (ENDLESS_S). /metrics moves (a vLLM exposition whose token
counter grows on every scrape) so the engine itself never looks stalled or idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from engine_watchdog.sim.launcher import free_port
from tests.tools.stub_engine import vllm_exposition

ENDLESS_S = 60.0
TOKENS: tuple[Mapping[str, object], ...] = (
    {"choices": [{"index": 0, "text": "a"}]},
    {"choices": [{"index": 0, "delta": {"content": "b"}}]},
    {"choices": [{"index": 0, "delta": {"reasoning_content": "c"}}]},
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}
        ]
    },
)
NO_TOKENS: tuple[Mapping[str, object], ...] = (
    {"choices": [{"index": 0, "delta": {}}]},
    {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    {"choices": [{"index": 0, "delta": {"content": ""}}]},
    {"choices": [{"index": 0, "text": ""}]},
)


def event(doc: Mapping[str, object]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class TokenEngine:
    url: str = ""
    ended: dict[str, str] = field(default_factory=dict)
    """tag -> "finished" or "cut" (the guard closed that request's engine connection)."""
    scrapes: itertools.count[int] = field(default_factory=itertools.count)

    async def metrics(self, request: web.Request) -> web.Response:
        body = vllm_exposition(running=2.0, tokens=float(10 * next(self.scrapes)))
        return web.Response(body=body, content_type="text/plain")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        spec = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        tag, outcome = str(spec.get("tag", "")), "cut"
        try:
            await self._stream(resp, spec)
            outcome = "finished"
        except (ConnectionError, asyncio.CancelledError):
            pass  # the guard closed this request's engine connection
        finally:
            self.ended[tag] = outcome
        return resp

    async def _stream(self, resp: web.StreamResponse, spec: dict[str, object]) -> None:
        mode = spec.get("mode", "moving")
        if mode == "moving":
            for n in range(int(str(spec.get("events", 4)))):
                await resp.write(event(TOKENS[n % len(TOKENS)]))
                await asyncio.sleep(0.1)
            await resp.write(b"data: [DONE]\n\n")
            return
        await resp.write(event(TOKENS[0]))
        deadline = time.monotonic() + ENDLESS_S
        for n in itertools.count():
            if time.monotonic() > deadline:
                raise ConnectionError("bounded")
            await asyncio.sleep(0.3)
            await resp.write(b": keepalive\n\n" if mode == "keepalive" else event(NO_TOKENS[n % 5]))


@contextlib.asynccontextmanager
async def token_engine() -> AsyncIterator[TokenEngine]:
    engine = TokenEngine()
    app = web.Application()
    app.router.add_get("/metrics", engine.metrics)
    app.router.add_post("/v1/completions", engine.completions)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    engine.url = f"http://127.0.0.1:{port}"
    try:
        yield engine
    finally:
        await runner.cleanup()
