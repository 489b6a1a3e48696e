"""The guard's transparency, as the real-vLLM test checks it: the same request sent straight to
the engine and through the guard at the same moment, the two streams compared event for event."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.tools.guard import Stream, completion, stream
from tests.tools.recovery_harness import Supervised
from tests.tools.vllm_server import SERVED_MODEL, http_get
from tests.tools.watch import metric


async def pairs_of(
    direct: str, guard: str, clients: int, seconds: float
) -> list[tuple[Stream, Stream]]:
    """For ``seconds``, each client sends one request straight and the same through the guard,
    at once (temperature 0, a fixed seed per pair), again and again."""
    pairs: list[tuple[Stream, Stream]] = []
    deadline = time.monotonic() + seconds

    async def pair_client(i: int, session: aiohttp.ClientSession) -> None:
        n = 0
        while time.monotonic() < deadline:
            body = completion(SERVED_MODEL, 48 + 16 * i, seed=1234 + n)
            pair = await asyncio.gather(
                stream(session, direct, body, f"direct-{i}-{n}"),
                stream(session, guard, body, f"guard-{i}-{n}"),
            )
            pairs.append((pair[0], pair[1]))
            n += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(pair_client(i, session) for i in range(clients)))
    return pairs


async def watchdog_metric(sup: Supervised, name: str, **labels: str) -> float:
    """A series of the supervising watchdog's own /metrics (0 when absent)."""
    argv = [str(a) for a in sup.proc.args]  # type: ignore[union-attr]
    listen = argv[argv.index("--listen") + 1]
    _, text = await asyncio.to_thread(http_get, f"http://{listen}/metrics")
    return metric(text, name, **labels) or 0.0
