"""The guard's proxy: every request to the engine passes through, byte for byte; each stream's
progress is noted on the way (only its SSE framing and its tokens are read, guard/scan.py),
and the streams the supervisor says are ended with an error in vLLM's own shape.

Transparent: every method and path, status, reason, headers (less the hop-by-hop ones) and
bodies as they are (never decompressed); the guard adds no header and no credential of its own,
so a client without credentials meets the engine's own 401. Streams are written to the client
piece by piece as they come (guard/fast.py, the one data path), and a client that reads slowly
stops the guard reading from the engine (back-pressure). A client that goes away closes its
engine connection, which vLLM takes as an abort (``@with_cancellation``, vllm/entrypoints/utils.py).

Nothing on the path of the bytes waits on a judgement: the request judge reads snapshots
(:meth:`Guard.snapshot`) between chunks, and the supervisor's decisions arrive as task
cancellations (:meth:`Guard.end`, :meth:`Guard.end_all`). Open requests are keyed by the
guard's own id: a client's X-Request-Id is only a label, so no client can name another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import resource
import time
from collections.abc import Callable

from aiohttp import web

from engine_watchdog.core.model import GuardObs, QuietStream
from engine_watchdog.core.serving import GuardSettings
from engine_watchdog.core.wire import GAP_BOUNDS
from engine_watchdog.guard import scan
from engine_watchdog.guard.answers import Ending, json_error, sse_error
from engine_watchdog.guard.conns import Connections
from engine_watchdog.guard.exchange import QUIET_S, Exchange, forwarded
from engine_watchdog.guard.fast import NotListening, OutOfDescriptors, UpstreamError
from engine_watchdog.guard.held import SelfCheck
from engine_watchdog.guard.lanes import Lanes
from engine_watchdog.guard.relay import Relay
from engine_watchdog.guard.scan import new_progress
from engine_watchdog.guard.stats import GuardStats
from engine_watchdog.net.connection import Upstream

log = logging.getLogger(__name__)

EXEMPT = {("GET", "/metrics")}
"""Still passed while the guard refuses requests: the engine's own metrics stay visible."""


class Guard:
    """The proxy in front of one engine; start() it, point clients at its address."""

    def __init__(
        self,
        settings: GuardSettings,
        upstream: Upstream,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``upstream``: the engine's address and TLS (net/connection.py), never a credential."""
        self.settings = settings
        self.upstream = upstream
        self.clock = clock
        self.stats = GuardStats()
        self.open: dict[str, Exchange] = {}
        """The requests in flight, by the guard's own id."""
        self.refusal: str | None = None
        """While set, new requests are answered 503 with this message."""
        self.stopping: str | None = None
        """Set once the guard drains (guard/drain.py): the refusal that nothing lifts."""
        self.conns = Connections(
            settings.head_timeout_s, settings.max_idle_connections, self.stats.closed
        )
        self._server: asyncio.Server | None = None
        self._serial = itertools.count()
        self._runner: web.AppRunner | None = None
        self._seen = (0, 0, [0] * (len(GAP_BOUNDS) + 1))
        self.port = 0
        self._relay = Relay(
            upstream, self.stats, clock, settings.connect_timeout_s, lambda: self.lanes
        )
        self.self_check = SelfCheck(settings.held_limit_s, self.stats)
        """Every request it holds moves, or is ended, within the limit (guard/held.py)."""
        self.lanes: Lanes | None = None
        """The relay thread (guard/lanes.py), while the guard runs where it is built."""

    # -- life -----------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        raise_open_files_limit()
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
        self.lanes = Lanes.start(self.stats)
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # uvloop or asyncio
        up = self.upstream
        engine = f"{up.scheme}://{up.authority}{up.base_path}"  # (no credential: none is here)
        kind = "compiled" if scan.COMPILED else "Python"  # (guard/scan.py)
        kind += ", relay thread" if self.lanes is not None else ""
        log.info(
            "guard on http://%s:%d in front of %s (event loop: %s, per-event rules: %s)",
            host,
            self.port,
            engine,
            loop,
            kind,
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.lanes is not None:
            self.lanes.close()
            self.lanes = None

    # -- the supervisor's orders -----------------------------------------------------------

    def refuse(self, message: str | None) -> None:
        """Answer new requests 503 with ``message`` (None: pass them again)."""
        message = self.stopping or message  # draining: nothing admits again
        if message != self.refusal and message:
            log.warning("guard: refusing new requests: %s", message)
        elif message != self.refusal:
            log.info("guard: passing requests again")  # the all-clear is no warning
        self.refusal = message

    def count_stuck(self) -> None:
        self.stats.stuck += 1

    def end(self, key: str, message: str) -> bool:
        """End one stuck request on both sides, named by the guard's own id (the judge's);
        False when it is not (or no longer) here."""
        ex = self.open.get(key)
        return ex is not None and self._end(ex, Ending.STUCK, message)

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
        ex.ending, ex.detail, ex.ended_t = why, message, self.clock()
        if ex.upstream is not None:
            ex.upstream.close()  # the engine sees its client gone: vLLM aborts the request
        ex.pump.cancel()
        return True

    # -- the probe -------------------------------------------------------------------------

    def count(self) -> None:
        """The relay thread's counts into :attr:`stats` (before they are read)."""
        if self.lanes is not None:
            self.lanes.sync()

    def snapshot(self, t: float) -> GuardObs:
        """What the wire showed since the last snapshot, and every stream quiet a second."""
        self.count()
        self.self_check.check(list(self.open.values()), t)
        stats = self.stats
        events, finished, gaps = self._seen
        counts = list(stats.gaps.snapshot()[0])
        completed = stats.outcomes["completed"]
        self._seen = (stats.events, completed, counts)
        quiet, decoding, awaiting, oldest = [], 0, 0, None
        for ex in self.open.values():
            if ex.last_event_t is None:
                if _awaits_first_token(ex):
                    awaiting += 1
                    oldest = ex.started_t if oldest is None else min(oldest, ex.started_t)
                continue
            if not ex.sse:
                continue
            decoding += 1
            if t - ex.last_event_t >= QUIET_S:
                quiet.append(
                    QuietStream(
                        ex.key,
                        ex.started_t,
                        ex.first_event_t,
                        ex.last_event_t,
                        ex.events,
                        ex.waiting_since,
                        ex.label,
                    )
                )
        return GuardObs(
            t=t,
            open=len(self.open),
            decoding=decoding,
            events=stats.events - events,
            finished=completed - finished,
            last_event_t=stats.last_event_t,
            gaps=tuple(a - b for a, b in zip(counts, gaps, strict=True)),
            quiet=tuple(quiet),
            awaiting=awaiting,
            awaiting_since=oldest,
        )

    # -- the path of the bytes --------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.stats.end("too-large")
            limit = self.settings.max_body_bytes
            return json_error(f"request body over {limit} bytes", 413, "BadRequestError")
        # Again once the body is in: a stall judged while it came ended every request in
        # ``open`` (end_all), which this one was not yet in; passed on, it would hang on the
        # stalled engine with nothing to end it.
        refused = self._refused(request)
        if refused is not None:
            return refused
        headers = forwarded(request.headers)
        key = f"g{next(self._serial)}"
        label, progress = request.headers.get("X-Request-Id", ""), new_progress(self.stats.gaps)
        ex = Exchange(key, label, self.clock(), progress)
        self.open[key] = ex
        outcome = "client-gone"
        try:
            ex.pump = asyncio.ensure_future(self._relay.pump(request, ex, headers, body))
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
            except UpstreamError as exc:
                outcome = "upstream-error"
                return self._upstream_failed(request, ex, exc)
        finally:
            del self.open[key]
            if ex.pump is not None and not ex.pump.done():
                ex.pump.cancel()
            self.stats.end(outcome)

    def _refused(self, request: web.Request) -> web.Response | None:
        """The 503 of a guard that refuses requests, or None: this one passes."""
        if self.refusal is None or (request.method, request.path) in EXEMPT:
            return None
        self.stats.end("refused")
        return json_error(self.refusal, retry_after=self.settings.retry_after_s)

    async def _answer(self, request: web.Request, ex: Exchange) -> web.StreamResponse:
        """The error in the engine's place: an error event and [DONE] in a stream, a JSON
        error before one started; a plain body under way can only be cut."""
        resp = ex.response
        names = f" (X-Request-Id {ex.label!r})" if ex.label else ""
        names += f" (engine id {ex.engine_id})" if ex.engine_id else ""
        log.warning("guard: ended request %s%s: %s", ex.key, names, ex.detail)
        if resp is None:
            return json_error(ex.detail, retry_after=self.settings.retry_after_s)
        if ex.sse:
            complete = ex.progress.boundary
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await resp.write(sse_error(ex.detail, complete))
                await resp.write_eof()
            return resp
        resp.force_close()
        if request.transport is not None:
            request.transport.close()
        return resp

    def _upstream_failed(
        self, request: web.Request, ex: Exchange, exc: UpstreamError
    ) -> web.StreamResponse:
        if ex.response is None and isinstance(exc, OutOfDescriptors):
            # The guard's own limit, for a moment: retryable, and said as such.
            return json_error(f"engine-watchdog: {exc}", retry_after=self.settings.retry_after_s)
        if ex.response is None and isinstance(exc, NotListening):
            # Nothing listens (a restart, a crash): what the 503 gate answers, at once.
            message = "engine-watchdog: the engine is not listening; retry later or elsewhere"
            return json_error(message, retry_after=self.settings.retry_after_s)
        if ex.response is None:
            return json_error(f"engine-watchdog: the engine failed: {exc}", 502, "BadGatewayError")
        ex.response.force_close()  # cut, as the engine cut it: no clean end is made up
        if request.transport is not None:
            request.transport.close()
        return ex.response


def _awaits_first_token(ex: Exchange) -> bool:
    """The guard waits on the engine for this request's first token: its answer has not begun,
    or it is a stream with no token yet (a plain body under way is moving), and it is not
    being ended."""
    return ex.ending is None and ex.waiting_since is not None and (ex.response is None or ex.sse)


SHUTDOWN_S = 2.0
"""aiohttp's own bound on each of its two waits for handlers at cleanup."""
OPEN_FILES_WANTED = 65536
"""Two sockets per stream (client and engine), four while the relay thread holds duplicates of
both (guard/lanes.py): the usual soft limit of 1024 would cap the guard near 250-500 streams,
and a refused accept() leaves a client waiting."""


def raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        log.info("guard: open files limit raised from %d to %d", soft, wanted)
