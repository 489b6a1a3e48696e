"""The API process's side of the engine cores (vLLM: AsyncLLM + its EngineCore clients).

Starts one engine-core child per data-parallel rank, sends requests and aborts, reads every
step's outputs on a named task, turns them into per-request token deltas and into metrics (the
API process owns the metrics, as in vLLM), and notices an engine core's death by the EOF on its
socket. Requests are finished locally when aborted: an abort never waits for the engine loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine_watchdog.sim import protocol as p
from engine_watchdog.sim.api_metrics import SimMetrics
from engine_watchdog.sim.loggers import LoggingStatLogger
from engine_watchdog.sim.protocol import FinishedRequest, IterationStats
from engine_watchdog.sim.settings import SimSettings

log = logging.getLogger("engine_watchdog.sim.client")

REQUEST_WAIT_BOUND_S = 3600.0
"""Longest wait for an engine reply (a token, a utility result). Far beyond any client timeout:
like vLLM, a hung engine keeps clients waiting; this only keeps every wait bounded."""

CHILD_EXIT_GRACE_S = 2.0


class EngineDeadError(RuntimeError):
    """The engine core died (vLLM: EngineDeadError)."""

    def __init__(self) -> None:
        super().__init__(
            "EngineCore encountered an issue. See stack trace (above) for the root cause."
        )


@dataclass(frozen=True)
class Delta:
    """New tokens of one request; ``finish_reason`` set on its last delta."""

    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class RequestState:
    """One in-flight request, as the API process tracks it."""

    request_id: str
    rank: int
    prompt_tokens: int
    max_tokens: int
    arrival: float
    queue: asyncio.Queue[Delta | None] = field(default_factory=asyncio.Queue)
    """Deltas for the request's handler; None means the engine died."""
    num_generated: int = 0
    first_token_at: float | None = None


class EngineClient:
    """One engine-core child process and the socket to it."""

    def __init__(self, rank: int, settings: SimSettings) -> None:
        self.rank = rank
        self.settings = settings
        self.proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.StreamReader | None = None
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._next_call = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        """Spawn the child, hand it the settings, wait (bounded) for its handshake."""
        ours, theirs = socket.socketpair()
        with theirs:
            cmd = [sys.executable, "-m", "engine_watchdog.sim.engine", "--fd", str(theirs.fileno())]
            cmd += ["--parent-pid", str(os.getpid())]
            # Forked from the event loop's thread, which lives as long as the process: the
            # child's parent-death signal is tied to the forking thread.
            self.proc = await asyncio.create_subprocess_exec(
                *cmd, pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL
            )
        self._reader, self._writer = await asyncio.open_unix_connection(
            sock=ours, limit=p.MAX_LINE_BYTES
        )
        init = {"rank": self.rank, "settings": self.settings.to_wire()}
        self.send(p.INIT, init)
        line = await asyncio.wait_for(self._reader.readline(), self.settings.engine_start_timeout)
        if not line:
            raise RuntimeError(f"engine core {self.rank} exited during start-up")
        kind, _ = p.decode(line)
        if kind != p.READY:
            raise RuntimeError(f"engine core {self.rank} sent {kind!r} before ready")

    def send(self, kind: str, body: dict[str, Any]) -> None:
        assert self._writer is not None
        self._writer.write(p.encode(kind, body))

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        """A utility call; waits for the engine's reply (for busy-loop methods, on its loop)."""
        self._next_call += 1
        call_id = self._next_call
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        self.send(p.CALL, {"call_id": call_id, "method": method, "args": args})
        try:
            return await asyncio.wait_for(fut, REQUEST_WAIT_BOUND_S)
        finally:
            self._calls.pop(call_id, None)

    async def messages(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Every message from the engine core until EOF (its death or our close)."""
        assert self._reader is not None
        while line := await self._reader.readline():
            kind, body = p.decode(line)
            if kind == p.RESULT:
                fut = self._calls.get(int(body["call_id"]))
                if fut is not None and not fut.done():
                    fut.set_result(body.get("result"))
                continue
            yield kind, body

    def fail_calls(self) -> None:
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(EngineDeadError())

    async def stop(self) -> None:
        """Close the socket (the child exits on EOF); SIGKILL it if it cannot (stopped, ...)."""
        if self._writer is not None:
            self._writer.close()
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            await asyncio.wait_for(self.proc.wait(), CHILD_EXIT_GRACE_S)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await asyncio.wait_for(self.proc.wait(), CHILD_EXIT_GRACE_S)


class EngineGroup:
    """All engine ranks behind one API process: routing, request state, metrics, death."""

    def __init__(
        self, settings: SimSettings, metrics: SimMetrics, on_dead: Callable[[int], None]
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._on_dead = on_dead  # called with the exit code the API process should use
        ranks = range(settings.data_parallel_size)
        self.clients = [EngineClient(r, settings) for r in ranks]
        self.stat_loggers = (
            [] if settings.disable_log_stats else [LoggingStatLogger(r) for r in ranks]
        )
        self.requests: dict[str, RequestState] = {}
        self.fault_states: dict[int, dict[str, Any]] = {}
        self.dead = False
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await asyncio.gather(*(c.start() for c in self.clients))
        for c in self.clients:
            task = asyncio.create_task(self._read(c), name=f"engine-core-{c.rank}-outputs")
            self._tasks.append(task)

    async def stop(self) -> None:
        self._closing = True
        self._fail_all()
        for c in self.clients:
            c.fail_calls()  # a /pause waiting on a hung loop ends now, not at the HTTP timeout
        await asyncio.gather(*(c.stop() for c in self.clients), return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def add_request(
        self, request_id: str, prompt_tokens: int, max_tokens: int, ignore_eos: bool
    ) -> RequestState:
        if self.dead or self._closing:
            raise EngineDeadError()
        if request_id in self.requests:
            raise ValueError(f"Request id {request_id} already running.")
        rank = min(range(len(self.clients)), key=self._load)
        state = RequestState(request_id, rank, prompt_tokens, max_tokens, time.monotonic())
        self.requests[request_id] = state
        add = p.AddRequest(request_id, prompt_tokens, max_tokens, ignore_eos)
        self.clients[rank].send(p.ADD, asdict(add))
        return state

    def _load(self, rank: int) -> int:
        return sum(1 for s in self.requests.values() if s.rank == rank)

    async def deltas(self, state: RequestState) -> AsyncGenerator[Delta, None]:
        """The request's deltas until it finishes; aborts it if the consumer stops early."""
        finished = False
        try:
            while not finished:
                delta = await asyncio.wait_for(state.queue.get(), REQUEST_WAIT_BOUND_S)
                if delta is None:
                    raise EngineDeadError()
                finished = delta.finish_reason is not None
                yield delta
        finally:
            if not finished and state.request_id in self.requests:
                self.abort([state.request_id])  # the client went away (vLLM aborts too)

    def abort(self, request_ids: list[str]) -> list[str]:
        """Finish the requests locally (finish_reason abort), then tell their engines."""
        by_rank: dict[int, list[str]] = {}
        for rid in request_ids:
            state = self.requests.pop(rid, None)
            if state is not None:
                state.queue.put_nowait(Delta([], "abort"))
                by_rank.setdefault(state.rank, []).append(rid)
        for rank, ids in by_rank.items():
            self.clients[rank].send(p.ABORT, {"request_ids": ids})
        return [rid for ids in by_rank.values() for rid in ids]

    async def call(
        self, method: str, args: dict[str, Any], ranks: list[int] | None = None
    ) -> list[Any]:
        if self.dead:
            raise EngineDeadError()
        targets = [
            self.clients[r] for r in (ranks if ranks is not None else range(len(self.clients)))
        ]
        return list(await asyncio.gather(*(c.call(method, args) for c in targets)))

    async def _read(self, client: EngineClient) -> None:
        try:
            async for kind, body in client.messages():
                if kind == p.OUTPUTS:
                    self._on_outputs(client.rank, p.EngineOutputs.from_wire(body))
                elif kind == p.FAULT_STATE:
                    self.fault_states[client.rank] = body
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # same as EOF: the engine core is gone
        except Exception:
            log.exception("reading engine core %d failed", client.rank)
            self._dead(client, exit_code=1)
            return
        self._dead(client, exit_code=0)

    def _dead(self, client: EngineClient, exit_code: int) -> None:
        if self._closing or self.dead:
            return
        self.dead = True
        log.error(
            "Engine core proc EngineCore_DP%d died unexpectedly, shutting down client.", client.rank
        )
        for c in self.clients:
            c.fail_calls()
        self._fail_all()
        self._on_dead(exit_code)

    def _fail_all(self) -> None:
        for state in self.requests.values():
            state.queue.put_nowait(None)
        self.requests.clear()

    def _on_outputs(self, rank: int, outs: p.EngineOutputs) -> None:
        now = time.monotonic()
        it = IterationStats()
        processed = 0
        for out in outs.outputs:
            state = self.requests.get(out.request_id)
            if state is None:
                continue  # finished here already (aborted by a client or an admin)
            processed += 1
            _account(state, out, it, now)
            state.queue.put_nowait(Delta(out.new_token_ids, out.finish_reason))
            if out.finish_reason is not None:
                del self.requests[out.request_id]
        stats_it = it if processed else None  # vLLM makes iteration stats only for outputs
        self.metrics.record(rank, outs.stats, stats_it)
        if self.stat_loggers:
            self.stat_loggers[rank].record(outs.stats, stats_it)


def _account(state: RequestState, out: p.TokenOutput, it: IterationStats, now: float) -> None:
    if out.new_token_ids and state.first_token_at is None:
        # The prefill completed in this step: only now do its prompt tokens count (as in vLLM).
        state.first_token_at = now
        it.num_prompt_tokens += state.prompt_tokens
        it.time_to_first_tokens.append(now - state.arrival)
    state.num_generated += len(out.new_token_ids)
    it.num_generation_tokens += len(out.new_token_ids)
    if out.finish_reason is not None:
        done = FinishedRequest(
            out.finish_reason, now - state.arrival, state.prompt_tokens, state.num_generated
        )
        it.finished.append(done)
