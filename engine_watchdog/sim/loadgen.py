"""Streaming load against an OpenAI-compatible server: N clients, each looping on streaming
``/v1/completions`` requests, counting how each request ended.

Bounded in time: clients issue no new request after ``deadline_s``, each request has a total
timeout, and ``stop(drain_s)`` waits at most ``drain_s`` for in-flight requests before it
cancels them and counts them as hanging. Use it as an async context manager so the clients are
always stopped, also when a test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from types import TracebackType

import aiohttp

DEFAULT_PROMPT = "The engine served every request until"
ERROR_BACKOFF_S = 0.2
MAX_KEPT_ERRORS = 20


@dataclass(frozen=True)
class LoadOutcome:
    """How the requests of one load run ended."""

    started: int
    completed: int
    errored: int
    hanging: int
    chunks: int
    errors: tuple[str, ...] = ()


@dataclass
class _Counts:
    started: int = 0
    completed: int = 0
    errored: int = 0
    in_flight: int = 0
    chunks: int = 0
    last_chunk_at: float = 0.0
    errors: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        self.errored += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(message)


class StreamingLoad:
    """``clients`` concurrent streaming clients against ``base_url``.

    Client ``i`` asks for ``max_tokens - i * max_tokens // (2 * clients)`` tokens, so the
    clients fall out of step after their first round instead of finishing (and leaving the
    engine empty) all at the same moment.
    """

    def __init__(
        self,
        base_url: str,
        *,
        clients: int = 4,
        max_tokens: int = 200,
        model: str = "tiny",
        prompt: str = DEFAULT_PROMPT,
        request_timeout_s: float = 300.0,
        deadline_s: float = 600.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = f"{base_url.rstrip('/')}/v1/completions"
        self.clients = clients
        self.max_tokens = max_tokens
        self.body: dict[str, object] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,  # random weights may emit EOS early; we want full-length streams
            "temperature": 0.0,
        }
        self.headers = headers or {}
        """Sent with every request (an Authorization header for an engine with an API key)."""
        self.request_timeout_s = request_timeout_s
        self.deadline_s = deadline_s
        self.counts = _Counts()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._deadline = 0.0

    @property
    def in_flight(self) -> int:
        return self.counts.in_flight

    @property
    def chunks(self) -> int:
        return self.counts.chunks

    def start(self) -> None:
        if self._session is not None:
            raise RuntimeError("load already started")
        self._session = aiohttp.ClientSession()
        self._deadline = time.monotonic() + self.deadline_s
        self._tasks = [
            asyncio.create_task(self._client_loop(i), name=f"load-client-{i}")
            for i in range(self.clients)
        ]

    async def __aenter__(self) -> StreamingLoad:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop(drain_s=0.0)

    def client_max_tokens(self, index: int) -> int:
        return max(1, self.max_tokens - index * self.max_tokens // (2 * self.clients))

    async def _client_loop(self, index: int) -> None:
        body = {**self.body, "max_tokens": self.client_max_tokens(index)}
        while not self._stopping.is_set() and time.monotonic() < self._deadline:
            if not await self._one_request(body):
                await asyncio.sleep(ERROR_BACKOFF_S)

    async def _one_request(self, body: dict[str, object]) -> bool:
        """Send one streaming request; True when it completed with ``[DONE]``."""
        assert self._session is not None
        counts = self.counts
        counts.started += 1
        counts.in_flight += 1
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        try:
            async with self._session.post(
                self.url, json=body, headers=self.headers, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    counts.error(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                    return False
                error = await self._read_stream(resp)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            counts.error(f"{type(exc).__name__}: {exc}")
            return False
        finally:
            counts.in_flight -= 1
        if error:
            counts.error(error)
            return False
        counts.completed += 1
        return True

    async def _read_stream(self, resp: aiohttp.ClientResponse) -> str:
        """Consume an SSE stream; return '' when it ended with ``[DONE]``, else why not."""
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[len(b"data:") :].strip()
            if payload == b"[DONE]":
                return ""
            event = json.loads(payload)
            if "error" in event:
                return f"error event: {json.dumps(event['error'])[:200]}"
            self.counts.chunks += 1
            self.counts.last_chunk_at = time.monotonic()
        return "stream ended without [DONE]"

    def stop_new(self) -> None:
        """Issue no new request; in-flight ones go on (the seed's load winding down)."""
        self._stopping.set()

    async def wait_for(self, chunks: int = 1, in_flight: int = 1, timeout: float = 60.0) -> None:
        """Wait until at least ``chunks`` more chunks arrived and ``in_flight`` requests run."""
        target = self.counts.chunks + chunks
        deadline = time.monotonic() + timeout
        while self.counts.chunks < target or self.counts.in_flight < in_flight:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"load made no progress in {timeout:.0f} s: chunks {self.counts.chunks} "
                    f"(wanted {target}), in flight {self.counts.in_flight}, "
                    f"errors {self.counts.errors[:3]}"
                )
            await asyncio.sleep(0.1)

    async def stop(self, drain_s: float) -> LoadOutcome:
        """Issue no new request, wait ``drain_s`` for in-flight ones, cancel the rest."""
        self._stopping.set()
        hanging = 0
        if self._tasks:
            if drain_s > 0:
                await asyncio.wait(self._tasks, timeout=drain_s)
            hanging = self.counts.in_flight
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None
        return self.outcome(hanging)

    def outcome(self, hanging: int = 0) -> LoadOutcome:
        c = self.counts
        return LoadOutcome(
            started=c.started,
            completed=c.completed,
            errored=c.errored,
            hanging=hanging,
            chunks=c.chunks,
            errors=tuple(c.errors),
        )
