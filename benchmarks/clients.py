"""Clients spread over processes (benchmarks/guard.py --client-procs): at 1,024 streams one
Python client process is itself the bottleneck, and would hide the proxy's cost behind its own.

Each worker runs its share of the streams in the same measured window (a wall-clock window
given to all of them), returns what its clients saw and its own CPU time; the parent measures
the proxy over that window. The client's CPU share (of one core, the busiest worker) shows that
the clients keep up: well under 100 %, they read every event as it comes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import aiohttp

from benchmarks import guard


def ready() -> None:
    time.sleep(0.5)  # held, so that each of the first jobs starts a worker of its own


def worker(url: str, model: str, streams: int, window: list[float], tokens: int) -> guard.Phase:
    guard.MAX_TOKENS[0] = tokens
    phase = asyncio.run(_clients(url, model, streams, window))
    phase.seconds = window[1] - window[0]
    return phase


async def _clients(url: str, model: str, streams: int, window: list[float]) -> guard.Phase:
    phase = guard.Phase()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [
            asyncio.create_task(guard.one_stream(session, url, model, phase, window))
            for _ in range(streams)
        ]
        await asyncio.sleep(max(0.0, window[0] - time.time()))
        cpu0 = time.process_time()  # the client's own CPU inside the measured window only
        await asyncio.sleep(max(0.0, window[1] - time.time()))
        phase.client_cpu_s = time.process_time() - cpu0
        await asyncio.wait(tasks, timeout=5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return phase


def merge(parts: list[guard.Phase], seconds: float) -> guard.Phase:
    phase = guard.Phase(seconds=seconds)
    for part in parts:
        phase.events += part.events
        phase.latencies += part.latencies
        phase.first += part.first
        phase.errors += part.errors
        # the busiest worker's CPU share of one core in the window
        phase.client_cpu_pct = max(phase.client_cpu_pct, 100 * part.client_cpu_s / seconds)
    return phase


async def run_phase(
    url: str, model: str, streams: int, seconds: float, proxy: Any, procs: int, tokens: int
) -> guard.Phase:
    """guard.run_phase with the streams spread over ``procs`` processes."""
    shares = [streams // procs + (i < streams % procs) for i in range(procs)]
    loop = asyncio.get_running_loop()
    context = multiprocessing.get_context("spawn")  # no fork of a running event loop
    with ProcessPoolExecutor(procs, mp_context=context) as pool:
        # every worker started and its imports done before the window is set
        await asyncio.gather(*(loop.run_in_executor(pool, ready) for _ in range(procs)))
        begin = time.time() + guard.WARMUP_S + streams / 100  # room to open every stream
        window = [begin, begin + seconds]
        futures = [
            loop.run_in_executor(pool, worker, url, model, n, window, tokens) for n in shares if n
        ]
        await asyncio.sleep(max(0.0, begin - time.time()))
        cpu0 = proxy.cpu_times() if proxy is not None else None
        await asyncio.sleep(seconds)
        cpu = proxy.cpu_times() if proxy is not None else None
        rss = proxy.memory_info().rss / 2**20 if proxy is not None else 0.0
        parts = await asyncio.gather(*futures)
    phase = merge(list(parts), seconds)
    if cpu is not None and cpu0 is not None:
        phase.guard_cpu_s = cpu.user + cpu.system - cpu0.user - cpu0.system
        phase.guard_sys_s = cpu.system - cpu0.system
        phase.guard_rss_mb = rss
    return phase
