"""The guard's path to one engine: every request, from its connection to the engine to its
response's end, on the data path of guard/fast.py (docs/guard.md, "The data path")."""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import Callable

from aiohttp import web
from multidict import CIMultiDict

from engine_watchdog.guard.exchange import Exchange, returned
from engine_watchdog.guard.fast import (
    Client,
    EngineSide,
    NotListening,
    OutOfDescriptors,
    UpstreamError,
)
from engine_watchdog.guard.lanes import Lanes
from engine_watchdog.guard.stats import GuardStats
from engine_watchdog.net.connection import Upstream


def request_head(
    method: str, target: str, host: str, headers: CIMultiDict[str], size: int
) -> bytes:
    """The request line and headers of a request with a body of ``size`` bytes; ``Connection:
    close``: the connection is this request's alone (the engine closes it after the response,
    so the guard's side keeps no TIME_WAIT socket per request).

    Header text is what aiohttp's server parsed (undecodable bytes kept as surrogates), so it is
    written back byte for byte; a CR or LF in it would split the request and is refused."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"Content-Length: {size}", "Connection: close"]
    if any("\r" in line or "\n" in line for line in lines):
        raise UpstreamError("a CR or LF in the request line or a request header")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


class Relay:
    """The guard's path to one engine: every request, from its connection to its end."""

    def __init__(
        self,
        upstream: Upstream,
        stats: GuardStats,
        clock: Callable[[], float],
        timeout_s: float,
        lanes: Callable[[], Lanes | None],
    ) -> None:
        """``lanes``: the relay thread (guard/lanes.py) while the guard runs it, else None."""
        self.upstream = upstream
        self.stats = stats
        self.clock = clock
        self.timeout_s = timeout_s
        self.lanes = lanes

    async def pump(
        self, request: web.Request, ex: Exchange, headers: CIMultiDict[str], body: bytes
    ) -> web.StreamResponse:
        """One request, from its connection to the engine to its response's end."""
        up = await connect(self.upstream, request.method, self.timeout_s)
        ex.upstream = up
        try:
            _client_transport(request)  # (it may have left while the guard connected)
            assert up.transport is not None
            path = self.upstream.base_path + request.raw_path
            head = request_head(request.method, path, self.upstream.authority, headers, len(body))
            up.transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                up.transport.write(body)
            await up.head
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            resp.headers.extend(returned(up.headers))
            ex.sse = up.headers.get("Content-Type", "").startswith("text/event-stream")
            if ex.sse or "Transfer-Encoding" in up.headers:
                # chunked to the client: an error event can always follow what came
                resp.headers.popall("Content-Length", None)
            writer = await resp.prepare(request)
            assert writer is not None
            ex.response = resp
            framed = bool(getattr(writer, "chunked", False))  # aiohttp chose chunks for it
            stats = self.stats if ex.sse else None
            transport = _client_transport(request)
            client = Client(transport, ex, stats, framed, self.clock, self.lanes())
            await up.relay(client, writer)
            await resp.write_eof()
            return resp
        finally:
            up.close()


def _client_transport(request: web.Request) -> asyncio.Transport:
    """The client's connection; the client-gone path (proxy.py) where it has left."""
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("the client went away")
    return transport


async def connect(upstream: Upstream, method: str, timeout_s: float) -> EngineSide:
    loop = asyncio.get_running_loop()
    host, tls = upstream.host, upstream.tls
    try:
        _, up = await asyncio.wait_for(
            loop.create_connection(
                lambda: EngineSide(method),
                host,
                upstream.port,
                ssl=tls,
                server_hostname=host if tls is not None else None,
            ),
            timeout_s,
        )
    except asyncio.TimeoutError as exc:  # (before OSError: on 3.11 it is one)
        raise UpstreamError(f"no connection within {timeout_s:g} s") from exc
    except ssl.SSLError as exc:  # (before OSError: it is one) the engine answers, TLS fails
        raise UpstreamError(f"TLS with the engine failed: {exc}") from exc
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise OutOfDescriptors(
                f"the guard has no file descriptor left ({exc.strerror}): raise its open files "
                "limit (ulimit -n), or send fewer requests at once"
            ) from exc
        raise NotListening(str(exc)) from exc
    return up
