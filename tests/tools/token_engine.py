"""A REAL loopback aiohttp engine for the guard's token tests: each
POST /v1/completions says in its body what its stream does, and the engine keeps what became
of every stream by the body's ``tag`` (finished, or cut from the guard's side: an abort).

- ``{"mode": "moving", "events": N}``: N token events 0.1 s apart, cycling through every
  shape that carries tokens (completions ``text``, chat ``delta.content``,
  ``reasoning_content``, tool-call ``arguments``), then ``[DONE]``;
- ``{"mode": "keepalive"}``: one token, then only ``: keepalive`` comments every 0.3 s;
- ``{"mode": "empty"}``: one token, then only chunks without one (empty deltas, role-only,
  usage-only, empty text) every 0.3 s.

``"shape"`` writes the events in one of the event-stream shapes the WHATWG standard allows
(SHAPES: LF, CRLF, CR without the space after ``data:``, other fields and comments first, the
JSON split over two ``data`` lines); the engine keeps the bytes it sent by ``tag``. The endless
modes are bounded (ENDLESS_S). /metrics moves (a vLLM exposition whose token counter grows on
every scrape) so the engine itself never looks stalled or idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
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


def _split(text: bytes, eol: bytes) -> bytes:
    head, _, tail = text.partition(b",")
    return b"data: " + head + b"," + eol + b"data: " + tail + eol + eol


SHAPES: dict[str, Callable[[bytes], bytes]] = {
    "lf": lambda text: b"data: " + text + b"\n\n",
    "crlf": lambda text: b"data: " + text + b"\r\n\r\n",
    "cr": lambda text: b"data:" + text + b"\r\r",
    "fields": lambda text: b"event: message\r\nid: 7\r\n: note\r\ndata: " + text + b"\r\n\r\n",
    "split": lambda text: _split(text, b"\n"),
}
KEEPALIVE = {"lf": b": keepalive\n\n", "crlf": b": keepalive\r\n\r\n", "cr": b":keepalive\r\r",
             "fields": b": keepalive\r\n\r\n", "split": b": keepalive\n\n"}  # fmt: skip


def event(doc: Mapping[str, object], shape: str = "lf") -> bytes:
    return SHAPES[shape](json.dumps(doc, separators=(",", ":")).encode())


@dataclass
class TokenEngine:
    url: str = ""
    ended: dict[str, str] = field(default_factory=dict)
    """tag -> "finished" or "cut" (the guard closed that request's engine connection)."""
    sent: dict[str, bytes] = field(default_factory=dict)
    """tag -> the body bytes the engine wrote."""
    scrapes: itertools.count[int] = field(default_factory=itertools.count)

    async def metrics(self, request: web.Request) -> web.Response:
        body = vllm_exposition(running=2.0, tokens=float(10 * next(self.scrapes)))
        return web.Response(body=body, content_type="text/plain")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        spec = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        tag, outcome = str(spec.get("tag", "")), "cut"
        self.sent[tag] = b""
        real_write = resp.write

        async def write(data: bytes) -> None:
            await real_write(data)
            self.sent[tag] += data

        try:
            await self._stream(write, spec)
            outcome = "finished"
        except (ConnectionError, asyncio.CancelledError):
            pass  # the guard closed this request's engine connection
        finally:
            self.ended[tag] = outcome
        return resp

    async def _stream(
        self, write: Callable[[bytes], Awaitable[None]], spec: dict[str, object]
    ) -> None:
        mode, shape = spec.get("mode", "moving"), str(spec.get("shape", "lf"))
        if mode == "moving":
            for n in range(int(str(spec.get("events", 4)))):
                await write(event(TOKENS[n % len(TOKENS)], shape))
                await asyncio.sleep(0.1)
            await write(SHAPES[shape](b"[DONE]"))
            return
        await write(event(TOKENS[0], shape))
        deadline = time.monotonic() + ENDLESS_S
        for n in itertools.count():
            if time.monotonic() > deadline:
                raise ConnectionError("bounded")
            await asyncio.sleep(0.3)
            await write(KEEPALIVE[shape] if mode == "keepalive" else event(NO_TOKENS[n % 5], shape))


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
