"""The guard's proxy: every request to the engine passes through, byte for byte; each stream's
progress is noted on the way (only its SSE framing is read), and the streams the supervisor
says are ended with an error in vLLM's own shape.

Transparent: every method and path, status, reason, headers (less the hop-by-hop ones) and
bodies as they are (``auto_decompress`` off: compressed bodies stay compressed); streams are
written to the client chunk by chunk as they come, and a client that reads slowly stops the
guard reading from the engine (back-pressure). A client that goes away closes its upstream
connection, which vLLM takes as an abort (``@with_cancellation``, vllm/entrypoints/utils.py).

Nothing on the path of the bytes waits on a judgement: the request judge reads snapshots
(:meth:`Guard.snapshot`) between chunks, and the supervisor's decisions arrive as task
cancellations (:meth:`Guard.end`, :meth:`Guard.end_all`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import resource
import time
import uuid
from bisect import bisect_left
from collections.abc import Callable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from engine_watchdog.core.model import GuardObs, QuietStream
from engine_watchdog.core.settings import GuardSettings
from engine_watchdog.core.wire import GAP_BOUNDS
from engine_watchdog.guard.conns import Connections
from engine_watchdog.guard.errors import Ending, json_error, sse_error
from engine_watchdog.guard.exchange import (
    QUIET_S,
    SKIP_AUTO,
    DummyJar,
    Exchange,
    forwarded,
    returned,
)
from engine_watchdog.guard.fast import FastPath, NotListening, Target, UpstreamError, wants_stream
from engine_watchdog.guard.stats import GuardStats

log = logging.getLogger(__name__)

EXEMPT = {("GET", "/metrics")}
"""Still passed while the guard refuses requests: the engine's own metrics stay visible."""


class Guard:
    """The proxy in front of one engine; start() it, point clients at its address."""

    def __init__(
        self,
        settings: GuardSettings,
        upstream: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.upstream = upstream.rstrip("/")
        self.clock = clock
        self.stats = GuardStats()
        self.open: dict[int, Exchange] = {}
        self.refusal: str | None = None
        """While set, new requests are answered 503 with this message."""
        self.stopping: str | None = None
        """Set once the guard drains (guard/drain.py): the refusal that nothing lifts."""
        self.conns = Connections(
            settings.head_timeout_s, settings.max_idle_connections, self.stats.closed
        )
        self._server: asyncio.Server | None = None
        self.last_event_t: float | None = None
        self._serial = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._seen = (0, 0, [0] * (len(GAP_BOUNDS) + 1))
        self.port = 0
        target = Target.of(self.upstream) if settings.fast_path else None
        self._fast = (
            FastPath(target, self.note, clock, settings.connect_timeout_s) if target else None
        )
        """Streams to a plain http:// engine take the fast path (guard/fast.py)."""

    # -- life -----------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        raise_open_files_limit()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout_s)
        connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, cookie_jar=DummyJar()
        )
        app = web.Application(
            client_max_size=self.settings.max_body_bytes, middlewares=[self.conns.middleware]
        )
        app.router.add_route("*", "/{tail:.*}", self.handle)
        # Drained before it stops (guard/drain.py): aiohttp's wait for handlers (60 s by
        # default, and twice: once before cancelling them, once after) is only a backstop.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_S
        )
        await self._runner.setup()
        self._server = await self.conns.listen(self._runner, host, port)
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # uvloop or asyncio
        log.info("guard on http://%s:%d in front of %s (event loop: %s)", host, self.port,
                 self.upstream, loop)  # fmt: skip

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- the supervisor's orders -----------------------------------------------------------

    def refuse(self, message: str | None) -> None:
        """Answer new requests 503 with ``message`` (None: pass them again)."""
        message = self.stopping or message  # draining: nothing admits again
        if message != self.refusal:
            log.warning("guard: %s", f"refusing new requests: {message}" if message else "passing")
        self.refusal = message

    def count_stuck(self) -> None:
        self.stats.stuck += 1

    def end(self, request_id: str, message: str) -> bool:
        """End one stuck request on both sides; False when it is not (or no longer) here."""
        for ex in list(self.open.values()):
            if ex.request_id == request_id:
                return self._end(ex, Ending.STUCK, message)
        return False

    def stop_admitting(self, message: str) -> None:
        """From now on every new request gets 503 with ``message`` (the guard drains)."""
        self.stopping = message
        self.refuse(message)

    def end_all(self, message: str, why: Ending = Ending.STALL) -> int:
        """End every request in flight (the engine is stalled, or the guard stops); how many
        were ended."""
        return sum(self._end(ex, why, message) for ex in list(self.open.values()))

    def _end(self, ex: Exchange, why: Ending, message: str) -> bool:
        if ex.ending is not None or ex.pump is None or ex.pump.done():
            return False
        ex.ending, ex.detail = why, message
        if ex.upstream is not None:
            ex.upstream.close()  # the engine sees its client gone: vLLM aborts the request
        ex.pump.cancel()
        return True

    # -- the probe -------------------------------------------------------------------------

    def snapshot(self, t: float) -> GuardObs:
        """What the wire showed since the last snapshot, and every stream quiet a second."""
        stats = self.stats
        events, finished, gaps = self._seen
        counts = list(stats.gaps.counts)
        completed = stats.outcomes["completed"]
        self._seen = (stats.events, completed, counts)
        quiet, decoding = [], 0
        for ex in self.open.values():
            if not ex.sse or ex.last_event_t is None:
                continue
            decoding += 1
            if t - ex.last_event_t >= QUIET_S:
                quiet.append(
                    QuietStream(
                        ex.request_id,
                        ex.started_t,
                        ex.first_event_t,
                        ex.last_event_t,
                        ex.events,
                        ex.waiting_since,
                    )
                )
        return GuardObs(
            t=t,
            open=len(self.open),
            decoding=decoding,
            events=stats.events - events,
            finished=completed - finished,
            last_event_t=self.last_event_t,
            gaps=tuple(a - b for a, b in zip(counts, gaps, strict=True)),
            quiet=tuple(quiet),
        )

    # -- the path of the bytes --------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.refusal is not None and (request.method, request.path) not in EXEMPT:
            self.stats.end("refused")
            return json_error(self.refusal, retry_after=self.settings.retry_after_s)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.stats.end("too-large")
            limit = self.settings.max_body_bytes
            return json_error(f"request body over {limit} bytes", 413, "BadRequestError")
        headers = forwarded(request.headers)
        request_id = headers.get("X-Request-Id") or uuid.uuid4().hex
        headers["X-Request-Id"] = request_id
        ex = Exchange(request_id, self.clock())
        key = next(self._serial)
        self.open[key] = ex
        outcome = "client-gone"
        try:
            pump = self._pump
            if self._fast is not None and wants_stream(request, body):
                pump = self._fast.pump
            ex.pump = asyncio.ensure_future(pump(request, ex, headers, body))
            try:
                response = await ex.pump
                outcome = "completed"
                return response
            except asyncio.CancelledError:
                if ex.ending is None:
                    raise  # the client went away (or the guard stops)
                outcome = ex.ending.value
                return await self._answer(request, ex)
            except ConnectionResetError:  # writing to a client that left (aiohttp's own too)
                return ex.response or web.Response(status=499)
            except (aiohttp.ClientError, UpstreamError) as exc:
                outcome = "upstream-error"
                return self._upstream_failed(request, ex, exc)
        finally:
            del self.open[key]
            if ex.pump is not None and not ex.pump.done():
                ex.pump.cancel()
            self.stats.end(outcome)

    async def _pump(
        self, request: web.Request, ex: Exchange, headers: CIMultiDict[str], body: bytes
    ) -> web.StreamResponse:
        assert self._session is not None
        url = URL(self.upstream + request.raw_path, encoded=True)
        async with self._session.request(
            request.method,
            url,
            headers=headers,
            data=body if request.body_exists else None,
            allow_redirects=False,
            skip_auto_headers=SKIP_AUTO,
        ) as up:
            ex.upstream = up
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            resp.headers.extend(returned(up.headers))
            ex.sse = up.headers.get("Content-Type", "").startswith("text/event-stream")
            await resp.prepare(request)
            ex.response = resp
            if ex.sse:
                await self._stream(up, resp, ex)
            else:
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def _stream(
        self, up: aiohttp.ClientResponse, resp: web.StreamResponse, ex: Exchange
    ) -> None:
        """A stream on the aiohttp path: per chunk, note it, pass it on."""
        clock = self.clock
        ex.waiting_since = clock()
        async for chunk in up.content.iter_any():
            self.note(ex, chunk, clock())
            ex.waiting_since = None  # on the client now: a slow reader holds its own stream
            await resp.write(chunk)
            ex.waiting_since = clock()

    def note(self, ex: Exchange, chunk: bytes, now: float) -> None:
        """The hot path of both paths: count the events a chunk of an SSE stream ends (at a
        blank line, also one split across chunks) and time them (first event, gaps)."""
        n = chunk.count(b"\n\n") + (ex.last_chunk[-1:] == b"\n" and chunk[:1] == b"\n")
        ex.last_chunk = chunk
        if not n:
            return
        stats, last = self.stats, ex.last_event_t
        if last is None:
            ex.first_event_t = now
            first = stats.first_event
            first.counts[bisect_left(first.bounds, now - ex.started_t)] += 1
            first.total += now - ex.started_t
        else:
            stats.gaps.counts[bisect_left(GAP_BOUNDS, now - last)] += 1
            stats.gaps.total += now - last
        ex.last_event_t = self.last_event_t = now
        ex.events += n
        stats.events += n

    async def _answer(self, request: web.Request, ex: Exchange) -> web.StreamResponse:
        """The error in the engine's place: an error event and [DONE] in a stream, a JSON
        error before one started; a plain body under way can only be cut."""
        resp = ex.response
        log.warning("guard: ended request %s: %s", ex.request_id, ex.detail)
        if resp is None:
            return json_error(ex.detail, retry_after=self.settings.retry_after_s)
        if ex.sse:
            complete = ex.last_chunk.endswith(b"\n\n") or not ex.last_chunk
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await resp.write(sse_error(ex.detail, complete))
                await resp.write_eof()
            return resp
        resp.force_close()
        if request.transport is not None:
            request.transport.close()
        return resp

    def _upstream_failed(
        self, request: web.Request, ex: Exchange, exc: aiohttp.ClientError | UpstreamError
    ) -> web.StreamResponse:
        if ex.response is None and isinstance(exc, aiohttp.ClientConnectorError | NotListening):
            # Nothing listens (a restart, a crash): what the 503 gate answers, at once.
            message = "engine-watchdog: the engine is not listening; retry later or elsewhere"
            return json_error(message, retry_after=self.settings.retry_after_s)
        if ex.response is None:
            return json_error(f"engine-watchdog: the engine failed: {exc}", 502, "BadGatewayError")
        ex.response.force_close()  # cut, as the engine cut it: no clean end is made up
        if request.transport is not None:
            request.transport.close()
        return ex.response


SHUTDOWN_S = 2.0
"""aiohttp's own bound on each of its two waits for handlers at cleanup."""
OPEN_FILES_WANTED = 65536
"""Two sockets per stream (client and engine): the usual soft limit of 1024 would cap the guard
near 500 streams, and a refused accept() leaves a client waiting."""


def raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        log.info("guard: open files limit raised from %d to %d", soft, wanted)
