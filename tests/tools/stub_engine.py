"""A REAL aiohttp server on loopback that answers like a vLLM API server, route by route, as a
test tells it: expositions of any size sent in small chunks with delays (chunked or with a
Content-Length), endless bodies, bad bytes from tests/data/bad_input, over TLS if asked.

It runs in the test's own event loop; ``StubEngine.stop`` ends it (the fixture in
tests/integration/conftest.py does, pass or fail). Endless bodies are bounded too: a stub
never sends more than ENDLESS_MAX_BYTES nor for longer than ENDLESS_MAX_S.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from engine_watchdog.sim.launcher import free_port

BAD_INPUT = Path(__file__).resolve().parents[1] / "data" / "bad_input"
ENDLESS_MAX_BYTES = 1 << 30
ENDLESS_MAX_S = 60.0
ENDLESS_CHUNK = b"x" * 65536
ENDLESS_PAUSE_S = 0.001
"""Between endless chunks: at most ~64 MB/s, so a client that reads it whole grows visibly
(hundreds of MB in seconds) without taking the machine's memory."""
MODELS = b'{"object":"list","data":[{"id":"stub-model","object":"model"}]}'
COMPLETION = (
    b'{"object":"text_completion","choices":[{"index":0,"text":"!","finish_reason":"length"}]}'
)


@dataclass
class Body:
    """One answer: its bytes sent ``chunk`` bytes at a time, ``delay_s`` apart."""

    data: bytes = b""
    status: int = 200
    chunk: int = 16384
    delay_s: float = 0.0
    chunked: bool = True
    """False: a Content-Length header and no chunked encoding."""
    endless: bool = False
    """Send ``x`` bytes until the client goes away (or the stub's bounds)."""
    hang: bool = False
    """Never answer (until the client gives up)."""
    content_type: str = "text/plain; version=0.0.4"


def bad_input(name: str) -> bytes:
    return (BAD_INPUT / name).read_bytes()


def vllm_exposition(
    ranks: int = 1,
    *,
    running: float | str = 0.0,
    tokens: float | str = 0.0,
    filler_bytes: int = 0,
) -> bytes:
    """A vLLM-shaped /metrics: gauges first, ``filler_bytes`` of histogram buckets we never read,
    then the counters last (as a real exposition orders its families)."""
    lab = [f'engine="{r}",model_name="stub-model"' for r in range(ranks)]
    head = [f"vllm:num_requests_running{{{lb}}} {running}" for lb in lab]
    head += [f"vllm:num_requests_waiting{{{lb}}} 0.0" for lb in lab]
    head += [f"vllm:kv_cache_usage_perc{{{lb}}} 0.0" for lb in lab]
    filler: list[str] = []
    size, i = 0, 0
    while size < filler_bytes:
        line = f'vllm:e2e_request_latency_seconds_bucket{{{lab[i % ranks]},le="{i}.0"}} {i}.0'
        filler.append(line)
        size += len(line) + 1
        i += 1
    tail = [f"vllm:generation_tokens_total{{{lb}}} {tokens}" for lb in lab]
    tail += [f"vllm:iteration_tokens_total_count{{{lb}}} {tokens}" for lb in lab]
    return ("\n".join([*head, *filler, *tail]) + "\n").encode()


Route = Callable[[], Body]


@dataclass
class StubEngine:
    routes: dict[str, Route] = field(default_factory=dict)
    api_key: str | None = None
    """When set, /v1 routes answer 401 without ``Authorization: Bearer <key>`` (as vLLM)."""
    basic: str | None = None
    """``Basic <token>`` wanted on every route the key does not guard (a proxy's basic auth in
    front of the engine); 401 without it."""
    port: int = 0
    scheme: str = "http"
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    """(method, path, Authorization header) of every request."""
    cut_short: int = 0
    """Answers the client stopped reading before their end."""
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    async def start(self, tls: ssl.SSLContext | None = None) -> StubEngine:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        self.port = free_port()
        self.scheme = "https" if tls else "http"
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=tls).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        self.seen.append((request.method, request.path, auth))
        keyed = bool(self.api_key) and request.path.startswith("/v1")
        if keyed and auth != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if self.basic and not keyed and auth != self.basic:
            return web.json_response({"error": "Unauthorized"}, status=401)
        route = self.routes.get(request.path) or DEFAULT_ROUTES.get(request.path)
        if route is None:
            return web.Response(status=404, text="not found")
        body = route()
        if body.hang:
            await asyncio.sleep(ENDLESS_MAX_S)
            return web.Response(status=504)
        return await self._send(request, body)

    async def _send(self, request: web.Request, body: Body) -> web.StreamResponse:
        resp = web.StreamResponse(status=body.status, headers={"Content-Type": body.content_type})
        if body.chunked or body.endless:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = len(body.data)
        await resp.prepare(request)
        try:
            if body.endless:
                await _endless(resp)
            else:
                for start in range(0, len(body.data), body.chunk):
                    await resp.write(body.data[start : start + body.chunk])
                    if body.delay_s:
                        await asyncio.sleep(body.delay_s)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            self.cut_short += 1
        return resp


async def _endless(resp: web.StreamResponse) -> None:
    sent, deadline = 0, time.monotonic() + ENDLESS_MAX_S
    while sent < ENDLESS_MAX_BYTES and time.monotonic() < deadline:
        await resp.write(ENDLESS_CHUNK)
        sent += len(ENDLESS_CHUNK)
        await asyncio.sleep(ENDLESS_PAUSE_S)


DEFAULT_ROUTES: dict[str, Route] = {
    "/metrics": lambda: Body(vllm_exposition()),
    "/health": lambda: Body(b""),
    "/v1/models": lambda: Body(MODELS, content_type="application/json"),
    "/v1/completions": lambda: Body(COMPLETION, content_type="application/json"),
}
"""An idle, healthy vLLM."""


def self_signed(workdir: Path, name: str = "IP:127.0.0.1") -> tuple[Path, Path]:
    """(certificate, key) for ``name`` (a subjectAltName), made by Debian's openssl (bounded in
    time)."""
    import subprocess

    cert, key = workdir / "engine-cert.pem", workdir / "engine-key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", f"subjectAltName={name}",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


def server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx
